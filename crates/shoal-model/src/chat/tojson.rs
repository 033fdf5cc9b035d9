//! The `tojson` filter as llama.cpp's Jinja engine writes JSON (which follows Python's `json.dumps`):
//! `", "` and `": "` between items without `indent`, `","` and one item per line with it, keys in the
//! order the mapping gives them, non-ASCII characters as they are (escaped only with
//! `ensure_ascii=true`), and `/`, `<`, `>`, `&`, `'` never escaped (minijinja's own filter escapes the
//! HTML ones). Floats print as C++ streams print them (`%g`, six significant digits).
//!
//! Arguments as llama.cpp takes them: `ensure_ascii`, `indent`, `separators` by keyword or in that
//! order by position; `sort_keys=true` is an error there and here.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

struct Style {
    /// Negative: everything on one line.
    indent: i64,
    item_sep: String,
    key_sep: String,
}

/// `value | tojson(ensure_ascii, indent, separators)`.
pub(super) fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let pick = |name: &str, positional: Option<Value>| -> Result<Value, Error> {
        Ok(match kwargs.get::<Option<Value>>(name)? {
            Some(v) => v,
            None => positional.unwrap_or(Value::UNDEFINED),
        })
    };
    let ensure_ascii = pick("ensure_ascii", ensure_ascii)?.is_true();
    let indent = pick("indent", indent)?;
    let separators = pick("separators", separators)?;
    if kwargs
        .get::<Option<Value>>("sort_keys")?
        .is_some_and(|v| v.is_true())
    {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson sort_keys=true is not supported (nor by llama.cpp)",
        ));
    }
    let indent = if indent.is_integer() {
        indent.as_i64().unwrap_or(-1)
    } else {
        -1
    };
    let sep = |i: usize| -> Result<Option<String>, Error> {
        if separators.kind() != ValueKind::Seq {
            return Ok(None);
        }
        let item = separators.get_item(&Value::from(i))?;
        Ok(item.as_str().map(str::to_owned))
    };
    let style = Style {
        indent,
        item_sep: sep(0)?.unwrap_or_else(|| if indent < 0 { ", " } else { "," }.to_owned()),
        key_sep: sep(1)?.unwrap_or_else(|| ": ".to_owned()),
    };
    let mut out = String::new();
    write_value(&mut out, value, 0, &style, ensure_ascii)?;
    Ok(out)
}

fn write_value(
    out: &mut String,
    value: &Value,
    level: usize,
    style: &Style,
    ascii: bool,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&format_g(f64::try_from(value.clone())?)),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, level, style, |out, item| {
                write_value(out, item, level + 1, style, ascii)
            })?;
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('{', '}'), &keys, level, style, |out, key| {
                write_string(out, &key.to_string(), ascii);
                out.push_str(&style.key_sep);
                write_value(out, &value.get_item(key)?, level + 1, style, ascii)
            })?;
        }
        // none, undefined, bytes, plain objects, functions
        _ => out.push_str("null"),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    (open, close): (char, char),
    items: &[T],
    level: usize,
    style: &Style,
    mut write_item: impl FnMut(&mut String, &T) -> Result<(), Error>,
) -> Result<(), Error> {
    let pad = |out: &mut String, level: usize| {
        if style.indent > 0 {
            out.extend(std::iter::repeat_n(' ', level * style.indent as usize));
        }
    };
    let newline = if style.indent >= 0 { "\n" } else { "" };
    out.push(open);
    if !items.is_empty() {
        out.push_str(newline);
        for (i, item) in items.iter().enumerate() {
            pad(out, level + 1);
            write_item(out, item)?;
            if i + 1 < items.len() {
                out.push_str(&style.item_sep);
            }
            out.push_str(newline);
        }
        pad(out, level);
    }
    out.push(close);
    Ok(())
}

fn write_string(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        // Writing to a String cannot fail.
        let _ = match c {
            '"' => write!(out, "\\\""),
            '\\' => write!(out, "\\\\"),
            '\u{8}' => write!(out, "\\b"),
            '\u{c}' => write!(out, "\\f"),
            '\n' => write!(out, "\\n"),
            '\r' => write!(out, "\\r"),
            '\t' => write!(out, "\\t"),
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32),
            c if ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
                Ok(())
            }
            c => write!(out, "{c}"),
        };
    }
    out.push('"');
}

/// `x` as C's `printf("%g", x)` (and C++'s default stream output) writes it.
fn format_g(x: f64) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_owned();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    const PRECISION: i32 = 6;
    let sci = format!("{:.*e}", (PRECISION - 1) as usize, x);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..PRECISION).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_fraction(mantissa), exp.abs())
    } else {
        let decimals = (PRECISION - 1 - exp) as usize;
        trim_fraction(&format!("{x:.decimals$}")).to_owned()
    }
}

fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // 3.14159265 is a value to print, not π.
    #[allow(clippy::approx_constant)]
    fn floats_print_like_printf_g() {
        let cases = [
            (0.1, "0.1"),
            (1.5, "1.5"),
            (1e20, "1e+20"),
            (3.14159265, "3.14159"),
            (100000.0, "100000"),
            (1000000.0, "1e+06"),
            (999999.5, "1e+06"),
            (0.0001, "0.0001"),
            (0.00001234567, "1.23457e-05"),
            (-2.5e-300, "-2.5e-300"),
            (0.0, "0"),
            (-0.0, "-0"),
            (f64::INFINITY, "inf"),
        ];
        for (x, want) in cases {
            assert_eq!(format_g(x), want, "{x}");
        }
    }

    #[test]
    fn strings_escape_like_llama_cpp() {
        let mut out = String::new();
        write_string(&mut out, "a\"b\\c\n\t\u{1}é🙂</>&'", false);
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\t\\u0001é🙂</>&'\"");
        out.clear();
        write_string(&mut out, "é🙂", true);
        assert_eq!(out, "\"\\u00e9\\ud83d\\ude42\"");
    }
}
