//! The typed ids every shoal crate shares, so a node id can never be passed where an instance id or a
//! model id belongs, and each is checked once where it enters (a request, a wire message, a file):
//!
//! - [`NodeId`]: a member of the cluster, the text of its libp2p peer id (base58, e.g. `12D3KooW…`).
//! - [`InstanceId`]: one placed copy of a model, 64 random bits written as 16 lower-case hex digits —
//!   the same `u64` the data plane's handshake carries ([`InstanceId::as_u64`]), never parsed back from
//!   text by guesswork.
//! - [`ModelId`]: a model as the models dir and every API name it (a catalog id, `org/repo[:QUANT]`),
//!   under the one rule that keeps it from naming anything outside that dir ([`ModelId::parse`]).
//!
//! All three serialise as the plain strings they always were, so JSON and wire messages read the same
//! to nodes and clients that predate the types. This crate has no shoal dependency: it sits under
//! placement, the store, the engine, the cluster, the pipeline and the API alike.

use std::borrow::Borrow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why text is not an id of the kind asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("not a node id ({text:?}): {why}")]
    Node { text: String, why: &'static str },
    #[error("not an instance id ({text:?}): 16 hex digits expected")]
    Instance { text: String },
    #[error("not a model id ({text:?}): {why}")]
    Model { text: String, why: &'static str },
}

/// The first 80 characters of rejected text, for an error message.
fn excerpt(text: &str) -> String {
    text.chars().take(80).collect()
}

/// The longest node id taken (a libp2p peer id's text is 52 characters; room for other key types).
pub const MAX_NODE_ID_LEN: usize = 128;

/// A member of the cluster: the text of its libp2p peer id. Checked to be 1–128 ASCII letters, digits,
/// `-`, `_` or `.` (base58 is a subset), so it is safe in a URL path, a log line and a metric label.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(String);

impl NodeId {
    pub fn parse(text: &str) -> Result<Self, IdError> {
        let why = if text.is_empty() {
            "empty"
        } else if text.len() > MAX_NODE_ID_LEN {
            "longer than 128 characters"
        } else if !text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            "only ASCII letters, digits, '-', '_' and '.'"
        } else {
            return Ok(NodeId(text.to_string()));
        };
        Err(IdError::Node {
            text: excerpt(text),
            why,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One placed copy of a model: 64 bits, written as 16 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceId(u64);

impl InstanceId {
    pub const fn from_u64(id: u64) -> Self {
        InstanceId(id)
    }

    /// The form the data plane's handshake carries.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// A stable id derived from a name (FNV-1a of its bytes): how tests and fixtures name instances.
    pub fn derived_from(name: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        InstanceId(h)
    }

    /// Exactly 16 hex digits (either case); anything else is refused.
    pub fn parse(text: &str) -> Result<Self, IdError> {
        if text.len() == 16
            && text.bytes().all(|b| b.is_ascii_hexdigit())
            && let Ok(v) = u64::from_str_radix(text, 16)
        {
            return Ok(InstanceId(v));
        }
        Err(IdError::Instance {
            text: excerpt(text),
        })
    }
}

/// The longest model id taken.
pub const MAX_MODEL_ID_LEN: usize = 256;

/// The longest folder name most file systems allow (a model id's folder is [`ModelId::dir_name`]).
const MAX_DIR_NAME_LEN: usize = 255;

/// A model as the models dir and the APIs name it: a catalog id (`smollm2-135m-instruct-q4_1`) or a
/// hub reference (`org/repo[:QUANT]`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(String);

impl ModelId {
    /// The one rule every model id goes through before it names a folder: not empty, at most
    /// [`MAX_MODEL_ID_LEN`] bytes (and a folder name of at most 255), not a path (a leading `/`, `.` or
    /// `~`, a `..` or `.` part, a bare `name.gguf`), no backslashes or control characters (NUL).
    /// Decided from the text alone.
    pub fn parse(text: &str) -> Result<Self, IdError> {
        let why = if text.is_empty() {
            "empty"
        } else if text.len() > MAX_MODEL_ID_LEN || dir_name(text).len() > MAX_DIR_NAME_LEN {
            "longer than 256 bytes"
        } else if text.chars().any(|c| c.is_control() || c == '\\') {
            "control characters (NUL, newline) or backslashes"
        } else if text.split(['/', ':']).any(|p| p == ".." || p == ".") {
            "it could name a folder outside the models dir ('..')"
        } else if looks_like_path(text) {
            "a file path (a model is named by its id: a catalog id or org/repo[:QUANT])"
        } else {
            return Ok(ModelId(text.to_string()));
        };
        Err(IdError::Model {
            text: excerpt(text),
            why,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The models-dir folder of this id: `/` and `:` replaced by `--` (catalog ids unchanged).
    pub fn dir_name(&self) -> String {
        dir_name(&self.0)
    }
}

/// The models-dir folder of a model id's text: `/` and `:` replaced by `--`.
pub fn dir_name(id: &str) -> String {
    id.replace(['/', ':'], "--")
}

/// A leading `/`, `.` or `~`, or a name ending in `.gguf` with at most one `/` (`x.gguf`,
/// `dir/x.gguf`; `org/repo/file.gguf` is a hub file): a path, not an id.
pub fn looks_like_path(id: &str) -> bool {
    id.starts_with(['/', '.', '~'])
        || (id.to_ascii_lowercase().ends_with(".gguf") && id.matches('/').count() < 2)
}

/// The ids' texts joined by `sep` (for messages that list nodes).
pub fn join<T: fmt::Display>(ids: &[T], sep: &str) -> String {
    let mut out = String::new();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(&id.to_string());
    }
    out
}

/// What the three string-backed and hex ids share: text forms, comparisons with text, serde as strings.
macro_rules! text_id {
    ($ty:ident) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
        /// An id reads as its text wherever text is taken (never the other way round).
        impl std::ops::Deref for $ty {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }
        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl Borrow<str> for $ty {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
        impl PartialEq<String> for $ty {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }
        impl PartialEq<$ty> for String {
            fn eq(&self, other: &$ty) -> bool {
                *self == other.0
            }
        }
        impl PartialEq<$ty> for str {
            fn eq(&self, other: &$ty) -> bool {
                self == other.0
            }
        }
        impl PartialEq<$ty> for &str {
            fn eq(&self, other: &$ty) -> bool {
                *self == other.0
            }
        }
        impl From<$ty> for String {
            fn from(id: $ty) -> String {
                id.0
            }
        }
    };
}
text_id!(NodeId);
text_id!(ModelId);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{:016x}\"", self.0)
    }
}

macro_rules! parsed_id {
    ($ty:ident) => {
        impl FromStr for $ty {
            type Err = IdError;
            fn from_str(text: &str) -> Result<Self, IdError> {
                $ty::parse(text)
            }
        }
        impl TryFrom<&str> for $ty {
            type Error = IdError;
            fn try_from(text: &str) -> Result<Self, IdError> {
                $ty::parse(text)
            }
        }
        impl TryFrom<String> for $ty {
            type Error = IdError;
            fn try_from(text: String) -> Result<Self, IdError> {
                $ty::parse(&text)
            }
        }
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
                $ty::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}
parsed_id!(NodeId);
parsed_id!(InstanceId);
parsed_id!(ModelId);

/// OpenAPI schemas (feature `openapi`): each id is a string with its rule as the pattern.
#[cfg(feature = "openapi")]
mod openapi {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};

    fn string(description: &str, pattern: Option<&str>, max: Option<usize>) -> RefOr<Schema> {
        let mut b = ObjectBuilder::new()
            .schema_type(SchemaType::new(Type::String))
            .description(Some(description))
            .min_length(Some(1))
            .max_length(max);
        if let Some(p) = pattern {
            b = b.pattern(Some(p));
        }
        RefOr::T(Schema::Object(b.build()))
    }

    impl utoipa::PartialSchema for super::NodeId {
        fn schema() -> RefOr<Schema> {
            string(
                "A member's node id (its libp2p peer id).",
                Some("^[A-Za-z0-9._-]{1,128}$"),
                Some(super::MAX_NODE_ID_LEN),
            )
        }
    }
    impl utoipa::ToSchema for super::NodeId {}

    impl utoipa::PartialSchema for super::InstanceId {
        fn schema() -> RefOr<Schema> {
            string(
                "An instance id: 16 hex digits.",
                Some("^[0-9a-fA-F]{16}$"),
                Some(16),
            )
        }
    }
    impl utoipa::ToSchema for super::InstanceId {}

    impl utoipa::PartialSchema for super::ModelId {
        fn schema() -> RefOr<Schema> {
            string(
                "A model id: a catalog id or org/repo[:QUANT]; never a path.",
                None,
                Some(super::MAX_MODEL_ID_LEN),
            )
        }
    }
    impl utoipa::ToSchema for super::ModelId {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_are_sixteen_hex_digits_and_nothing_else() {
        let id = InstanceId::parse("00ff00ff00ff00ff").unwrap();
        assert_eq!(id.as_u64(), 0x00ff_00ff_00ff_00ff);
        assert_eq!(id.to_string(), "00ff00ff00ff00ff");
        assert_eq!(InstanceId::parse("00FF00FF00FF00FF").unwrap(), id);
        for bad in [
            "",
            "ff",
            "00ff00ff00ff00ff0",
            "+0ff00ff00ff00ff",
            "00ff00ff00ff00fg",
            "inst-1",
        ] {
            assert!(InstanceId::parse(bad).is_err(), "{bad:?}");
        }
        // the leading zeros survive the text form
        assert_eq!(InstanceId::from_u64(7).to_string(), "0000000000000007");
    }

    #[test]
    fn ids_serialise_as_the_strings_they_always_were() {
        let n = NodeId::parse("12D3KooWabc").unwrap();
        let i = InstanceId::from_u64(0xabc);
        let m = ModelId::parse("org/repo:Q4_K_M").unwrap();
        let json = serde_json::to_string(&(&n, i, &m)).unwrap();
        assert_eq!(
            json,
            r#"["12D3KooWabc","0000000000000abc","org/repo:Q4_K_M"]"#
        );
        let back: (NodeId, InstanceId, ModelId) = serde_json::from_str(&json).unwrap();
        assert_eq!(back, (n, i, m));
        // refused on the way in, with the reason
        let err = serde_json::from_str::<ModelId>(r#""../etc""#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("outside the models dir"), "{err}");
        assert!(serde_json::from_str::<NodeId>(r#""a b""#).is_err());
        assert!(serde_json::from_str::<InstanceId>(r#""x""#).is_err());
    }

    #[test]
    fn node_ids_are_url_and_label_safe() {
        for ok in ["12D3KooWQx9", "laptop-1", "a_b.c"] {
            assert!(NodeId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a b", "a:b", "é", "a\n", &"a".repeat(129)] {
            assert!(NodeId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn model_ids_that_could_leave_the_models_dir_are_refused() {
        for ok in [
            "smollm2-135m-instruct-q4_1",
            "org/repo",
            "org/repo:Q4_K_M",
            "org/repo/f.gguf",
            "a.b",
        ] {
            assert!(ModelId::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "..",
            ".hidden",
            "org/../x",
            "a/./b",
            "x:..",
            "/etc/passwd",
            "~/x",
            "x.gguf",
            "dir/x.gguf",
            "a\nb",
            "a\0b",
            "a\\b",
        ] {
            assert!(ModelId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ModelId::parse(&"x".repeat(300)).is_err());
        assert!(ModelId::parse(&"a:".repeat(100)).is_err());
        assert_eq!(
            ModelId::parse("org/repo:Q4").unwrap().dir_name(),
            "org--repo--Q4"
        );
    }

    #[test]
    fn ids_compare_with_text_and_look_up_maps_by_str() {
        let n = NodeId::parse("abc").unwrap();
        assert!(n == "abc");
        assert!("abc" == n);
        let map = std::collections::BTreeMap::from([(n.clone(), 1)]);
        assert_eq!(map.get("abc"), Some(&1));
    }
}
