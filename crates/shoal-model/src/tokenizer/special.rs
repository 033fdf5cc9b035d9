//! The special-token partition shared by every vocabulary type (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! [`Specials`] holds the control, user-defined and unknown tokens, longest text first. Its
//! [`partition`](Specials::partition) cuts a text into [`Frag`]s: each special token in turn splits
//! every stretch of plain text that is left, so a longer token wins over a shorter one it contains.
//! Control and unknown tokens are only matched with `parse_special`; user-defined tokens always are
//! (as in llama.cpp and HF `tokenizers`). A token with llama.cpp's LSTRIP / RSTRIP attribute also
//! eats the ASCII whitespace before / after it.

use super::TokenType;
use super::index::TextIndex;

/// A piece of the input: plain text still to be tokenized, or a special token already found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frag<'t> {
    Text(&'t str),
    Token(u32),
}

/// Whitespace a special token eats on each side (llama.cpp's LSTRIP / RSTRIP attributes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Strip {
    pub(crate) left: bool,
    pub(crate) right: bool,
}

#[derive(Debug)]
struct Special {
    id: u32,
    text: String,
    /// User-defined: matched even without `parse_special`.
    always: bool,
    strip: Strip,
}

/// The special tokens of a vocabulary, longest text first (llama.cpp's `cache_special_tokens`).
#[derive(Debug)]
pub(crate) struct Specials {
    entries: Vec<Special>,
}

impl Specials {
    /// Collects the control / user-defined / unknown tokens with a non-empty text; `strip` gives a
    /// token's LSTRIP / RSTRIP attributes from its text.
    pub(crate) fn new(
        tokens: &TextIndex,
        types: &[TokenType],
        strip: impl Fn(&str) -> Strip,
    ) -> Self {
        let mut entries: Vec<Special> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (text, ty))| {
                let special = matches!(
                    ty,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                );
                special && !text.is_empty()
            })
            .map(|(id, (text, ty))| Special {
                id: id as u32,
                text: text.to_owned(),
                always: *ty == TokenType::UserDefined,
                strip: strip(text),
            })
            .collect();
        entries.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        Self { entries }
    }

    /// Cuts `text` into plain-text stretches and special tokens, in order. An empty text gives no
    /// fragment at all.
    pub(crate) fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Frag<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        // A token whose first byte is nowhere in the text cannot match: most are skipped at once.
        let mut present = [false; 256];
        for &b in text.as_bytes() {
            present[usize::from(b)] = true;
        }
        let mut frags = vec![Frag::Text(text)];
        for sp in &self.entries {
            if !parse_special && !sp.always {
                continue;
            }
            let needle = sp.text.as_str();
            if !present[usize::from(needle.as_bytes()[0])]
                || !frags
                    .iter()
                    .any(|f| matches!(f, Frag::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Frag::Text(mut rest) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(pos) = rest.find(needle) {
                    let mut left = &rest[..pos];
                    if sp.strip.left {
                        left = left.trim_end_matches(is_c_space);
                    }
                    if !left.is_empty() {
                        next.push(Frag::Text(left));
                    }
                    next.push(Frag::Token(sp.id));
                    rest = &rest[pos + needle.len()..];
                    if sp.strip.right {
                        rest = rest.trim_start_matches(is_c_space);
                    }
                }
                if !rest.is_empty() {
                    next.push(Frag::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }
}

/// C's `isspace` in the "C" locale, which llama.cpp's strip uses.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r')
}

/// llama.cpp's strip attributes for Phi-3 vocabularies (`general.name` containing `phi-3` or `phi3`):
/// every special token eats the whitespace after it, except `<unk>`, `<s>` and `<|endoftext|>`.
pub(crate) fn phi3_strip(text: &str) -> Strip {
    Strip {
        left: false,
        right: !matches!(text, "<unk>" | "<s>" | "<|endoftext|>"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials(list: &[(&str, TokenType)], strip: impl Fn(&str) -> Strip) -> Specials {
        let tokens = TextIndex::new(list.iter().map(|(t, _)| *t));
        let types: Vec<TokenType> = list.iter().map(|(_, ty)| *ty).collect();
        Specials::new(&tokens, &types, strip)
    }

    #[test]
    fn longest_first_and_user_defined_always() {
        use TokenType::*;
        let sp = specials(
            &[
                ("a", Normal),
                ("<s>", Control),
                ("<s>x", Control),
                ("\n\n", UserDefined),
                ("\n", UserDefined),
            ],
            |_| Strip::default(),
        );
        assert_eq!(
            sp.partition("<s>xy<s>\n\n\n", true),
            [
                Frag::Token(2),
                Frag::Text("y"),
                Frag::Token(1),
                Frag::Token(3),
                Frag::Token(4)
            ]
        );
        assert_eq!(
            sp.partition("<s>x\n", false),
            [Frag::Text("<s>x"), Frag::Token(4)]
        );
        assert!(sp.partition("", true).is_empty());
        assert_eq!(sp.partition("plain", true), [Frag::Text("plain")]);
    }

    #[test]
    fn strip_eats_ascii_whitespace_only() {
        use TokenType::*;
        let sp = specials(&[("<|user|>", Control), ("<s>", Control)], |t| Strip {
            left: t == "<s>",
            right: t == "<|user|>",
        });
        assert_eq!(
            sp.partition("a <|user|>\n\t hi\u{a0}<s>", true),
            [
                Frag::Text("a "),
                Frag::Token(0),
                Frag::Text("hi\u{a0}"),
                Frag::Token(1)
            ]
        );
        assert_eq!(
            sp.partition(" \n<s> <|user|> ", true),
            [Frag::Token(1), Frag::Text(" "), Frag::Token(0)]
        );
    }
}
