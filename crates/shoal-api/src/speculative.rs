//! The `speculative` request extension every API accepts (OpenAI chat, completions and responses,
//! Anthropic messages, Ollama chat and generate): `{"method": "ngram" | "draft" | "mtp" | "off",
//! "max_draft": 1..=32}` or the method alone as a string. Absent or `null`: the server's default
//! (`shoal serve --speculative`). A bad value is a 400 naming the field, in the API's own error shape;
//! so is a method the model's instance cannot run (`draft` without a draft model, `mtp` without a
//! multi-token-prediction block).

use serde_json::Value;
use shoal_engine::Speculation;

use crate::error::ApiError;

/// Reads field `field` (`speculative`) of a request.
pub fn parse(field: &'static str, v: Option<&Value>) -> Result<Option<Speculation>, ApiError> {
    let bad = |msg: String| ApiError::invalid(field, msg);
    let (method, max_draft) = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(m)) => (m.as_str(), None),
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "method" && *k != "max_draft") {
                return Err(bad(format!(
                    "{field} has no field {k:?} (it takes \"method\" and \"max_draft\")"
                )));
            }
            let method = match o.get("method") {
                Some(Value::String(m)) => m.as_str(),
                _ => {
                    return Err(bad(format!(
                        "{field}.method must be \"ngram\", \"draft\", \"mtp\" or \"off\""
                    )));
                }
            };
            let max_draft = match o.get("max_draft") {
                None | Some(Value::Null) => None,
                Some(n) => Some(n.as_u64().ok_or_else(|| {
                    bad(format!(
                        "{field}.max_draft must be a positive integer, got {n}"
                    ))
                })?),
            };
            (method, max_draft)
        }
        Some(other) => {
            return Err(bad(format!(
                "{field} must be an object like {{\"method\": \"ngram\", \"max_draft\": 8}} or a method name, got {other}"
            )));
        }
    };
    Speculation::parse(method, max_draft)
        .map(Some)
        .map_err(|e| bad(format!("{field}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn methods_and_draft_lengths_parse_and_bad_ones_name_the_field() {
        let p = |v: Value| parse("speculative", Some(&v));
        assert_eq!(parse("speculative", None).unwrap(), None);
        assert_eq!(p(Value::Null).unwrap(), None);
        assert_eq!(
            p(json!({"method": "ngram", "max_draft": 5})).unwrap(),
            Some(Speculation::Ngram { max_draft: 5 })
        );
        assert_eq!(
            p(json!("ngram")).unwrap(),
            Some(Speculation::Ngram { max_draft: 8 })
        );
        assert_eq!(p(json!({"method": "off"})).unwrap(), Some(Speculation::Off));
        assert_eq!(
            p(json!({"method": "mtp", "max_draft": 3})).unwrap(),
            Some(Speculation::Mtp { max_draft: 3 })
        );
        for bad in [
            json!({"method": "medusa"}),
            json!({"method": "ngram", "max_draft": 0}),
            json!({"method": "ngram", "max_draft": 99}),
            json!({"method": "ngram", "max_draft": -1}),
            json!({"method": "ngram", "k": 3}),
            json!({"max_draft": 3}),
            json!(4),
        ] {
            let e = p(bad.clone()).unwrap_err();
            let text = format!("{e:?}");
            assert!(text.contains("speculative"), "{bad}: {text}");
        }
    }
}
