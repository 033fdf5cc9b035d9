//! Pre-tokenization: splitting text into "words" before byte-level BPE, as llama.cpp does.
//!
//! [`PreTokenizer`] is chosen by the GGUF key `tokenizer.ggml.pre`. It holds a list of regexes applied
//! one after the other, the way llama.cpp's `unicode_regex_split` does: each regex splits every piece
//! produced by the previous one, and the text *between* matches is kept as pieces of its own. A regex
//! only ever sees one piece, so a look-ahead like `\s+(?!\S)` stops at the piece's end.

use fancy_regex::Regex;

use super::TokenizerError;

/// The GPT-2 word regex (as written in llama.cpp; the trailing `|\s+` of the original is covered by
/// keeping unmatched text as its own piece).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3 (also dbrx, smaug): case-insensitive contractions, numbers in runs of up to three digits.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2 (also stablelm2): like Llama 3 but every digit is its own piece.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// gpt-4o / o200k (gpt-oss, Llama 4): cased words keep a leading capital run and a trailing lower run
/// with their contraction, numbers in runs of up to three digits, punctuation keeps trailing newlines
/// and slashes (the tokenizer.json regex; llama.cpp runs an equivalent spelled without `\p{Lu}`).
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The family of pre-tokenizers we know, named after llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2 regex only (`gpt-2`, `mpt`, `olmo`, `jais`, ...). Also the fallback for unknown names.
    Gpt2,
    /// Every digit split off first, then the GPT-2 regex (`smollm`, `starcoder`, `refact`,
    /// `command-r`, `codeshell`, `exaone`, `minerva-7b`).
    DigitsThenGpt2,
    /// Llama 3 regex (`llama-bpe`, `llama3`, `dbrx`, `smaug-bpe`, `falcon3`, `pixtral`).
    Llama3,
    /// Qwen 2 regex (`qwen2`, `stablelm2`, `deepseek-r1-qwen`, `megrez`, `hunyuan`).
    Qwen2,
    /// llama.cpp's `default` pre-tokenizer (punctuation runs, GPT-2, number runs, 3-digit groups).
    Default,
    /// gpt-4o's regex (`gpt-4o`: gpt-oss; `llama4`, `kanana2`, `talkie`).
    Gpt4o,
}

impl PreTokenizerKind {
    /// Maps a `tokenizer.ggml.pre` value to a kind; `None` when we do not know the name. The lists
    /// follow llama.cpp's `llama_vocab::impl::load` (names whose regexes are one of ours).
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        let kind = match name {
            "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion"
            | "granite-docling" | "jina-es" | "jina-de" | "jina-v1-en" | "jina-v2-es"
            | "jina-v2-de" | "jina-v2-code" | "roberta-bpe" | "gigachat" | "a.x-4.0" | "mellum"
            | "modern-bert" | "exaone4" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => Self::DigitsThenGpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "dbrx" | "smaug-bpe" | "falcon3"
            | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "jina-v5-nano" | "chatglm-bpe"
            | "glm4" | "glm5" => Self::Llama3,
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "megrez" | "hunyuan" | "kormo"
            | "f2llmv2" | "solar-open" => Self::Qwen2,
            "default" => Self::Default,
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => Self::Gpt4o,
            _ => return None,
        };
        Some(kind)
    }

    /// The regexes applied one after the other (llama.cpp's `regex_exprs` for this kind).
    pub fn patterns(self) -> &'static [&'static str] {
        match self {
            Self::Gpt2 => &[GPT2],
            Self::DigitsThenGpt2 => &[r"\p{N}", GPT2],
            Self::Llama3 => &[LLAMA3],
            Self::Qwen2 => &[QWEN2],
            Self::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            Self::Gpt4o => &[GPT4O],
        }
    }
}

/// Names of the Llama 3 kind for which llama.cpp does *not* set `ignore_merges` (same regex).
const LLAMA3_WITH_MERGES: &[&str] = &["dbrx", "smaug-bpe", "chatglm-bpe"];

/// Pre-tokenizer names whose files never start a prompt with BOS, whatever their BOS id says
/// (llama.cpp clears it for GLM's tokenizers: GLM-4.5's chat template writes `[gMASK]<sop>` itself).
pub const NO_BOS: &[&str] = &["chatglm-bpe", "glm4", "glm5"];

/// Splits raw text into words with a fixed list of compiled regexes.
#[derive(Debug)]
pub struct PreTokenizer {
    kind: PreTokenizerKind,
    regexes: Vec<Regex>,
    ignore_merges: bool,
}

impl PreTokenizer {
    /// Compiles the regexes of `kind`; Llama 3's kind ignores merges for whole-word vocabulary
    /// entries, as llama.cpp does for `llama-bpe`.
    pub fn new(kind: PreTokenizerKind) -> Result<Self, TokenizerError> {
        let regexes = kind
            .patterns()
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|source| TokenizerError::Regex {
                    pattern: (*p).to_string(),
                    source: Box::new(source),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            kind,
            regexes,
            ignore_merges: kind == PreTokenizerKind::Llama3,
        })
    }

    /// Picks the pre-tokenizer for a `tokenizer.ggml.pre` value. A missing name is llama.cpp's
    /// `default`; an unknown one (llama.cpp refuses the file) falls back to the GPT-2 regex with a
    /// warning.
    pub fn for_gguf_name(name: Option<&str>) -> Result<Self, TokenizerError> {
        let kind = match name {
            Some(n) => PreTokenizerKind::from_gguf_name(n).unwrap_or_else(|| {
                tracing::warn!(
                    pre = n,
                    "unknown tokenizer.ggml.pre, falling back to the GPT-2 regex"
                );
                PreTokenizerKind::Gpt2
            }),
            None => {
                tracing::warn!("no tokenizer.ggml.pre in the GGUF, using llama.cpp's `default`");
                PreTokenizerKind::Default
            }
        };
        let mut pre = Self::new(kind)?;
        if name.is_some_and(|n| LLAMA3_WITH_MERGES.contains(&n)) {
            pre.ignore_merges = false;
        }
        Ok(pre)
    }

    pub fn kind(&self) -> PreTokenizerKind {
        self.kind
    }

    /// Whether a word that is itself a vocabulary entry skips the merge loop (llama.cpp's
    /// `ignore_merges`: the Llama 3 names except `dbrx` and `smaug-bpe`).
    pub fn ignore_merges(&self) -> bool {
        self.ignore_merges
    }

    /// Splits `text` into words (sub-slices of `text`, in order, covering all of it).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces: Vec<&'t str> = if text.is_empty() {
            Vec::new()
        } else {
            vec![text]
        };
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                split_one(re, piece, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

/// Splits one piece with one regex, keeping the unmatched gaps (llama.cpp semantics).
fn split_one<'t>(re: &Regex, piece: &'t str, out: &mut Vec<&'t str>) {
    let mut last = 0;
    for m in re.find_iter(piece) {
        let m = match m {
            Ok(m) => m,
            // Backtracking limit hit (pathological input): keep the rest as one piece.
            Err(err) => {
                tracing::warn!(%err, "pre-tokenizer regex failed, keeping the rest unsplit");
                break;
            }
        };
        if m.start() > last {
            out.push(&piece[last..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push(&piece[last..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pre = PreTokenizer::new(kind).expect("patterns compile");
        pre.split(text).into_iter().map(str::to_owned).collect()
    }

    #[test]
    fn smollm_splits_every_digit() {
        let kind = PreTokenizerKind::from_gguf_name("smollm").expect("known");
        assert_eq!(kind, PreTokenizerKind::DigitsThenGpt2);
        assert_eq!(split(kind, "x=12345"), ["x", "=", "1", "2", "3", "4", "5"]);
        assert_eq!(split(kind, "1, 2, 3"), ["1", ",", " ", "2", ",", " ", "3"]);
        // Non-ASCII digits are \p{N} too.
        assert_eq!(split(kind, "٣٤"), ["٣", "٤"]);
    }

    #[test]
    fn gpt4o_splits_cased_runs_three_digit_groups_and_keeps_slashes_after_punctuation() {
        let kind = PreTokenizerKind::from_gguf_name("gpt-4o").expect("known");
        assert_eq!(kind, PreTokenizerKind::Gpt4o);
        assert_eq!(
            split(kind, "Hello WORLD's 12345 x//\n"),
            ["Hello", " WORLD's", " ", "123", "45", " x", "//\n"]
        );
        // A capital run then a lower run is one word; a lower-to-upper change starts the next.
        assert_eq!(
            split(kind, "HTMLParser camelCase"),
            ["HTMLParser", " camel", "Case"]
        );
    }

    #[test]
    fn glm_tokenizers_split_like_llama3_and_glm4_ignores_merges() {
        let kind = PreTokenizerKind::from_gguf_name("glm4").expect("known");
        assert_eq!(kind, PreTokenizerKind::Llama3);
        assert_eq!(
            split(kind, "It's 12345!"),
            ["It", "'s", " ", "123", "45", "!"]
        );
        let merges = |n| {
            PreTokenizer::for_gguf_name(Some(n))
                .expect("pre")
                .ignore_merges
        };
        assert!(merges("glm4") && merges("glm5") && !merges("chatglm-bpe"));
    }

    #[test]
    fn gpt2_keeps_number_runs_with_space() {
        assert_eq!(split(PreTokenizerKind::Gpt2, "a 123"), ["a", " 123"]);
    }

    #[test]
    fn no_prefix_space_and_whitespace_runs() {
        let kind = PreTokenizerKind::DigitsThenGpt2;
        assert_eq!(split(kind, "Hello"), ["Hello"]);
        assert_eq!(
            split(kind, "   leading spaces and\ttabs\nnewline"),
            [
                "  ", " leading", " spaces", " and", "\t", "tabs", "\n", "newline"
            ]
        );
        assert_eq!(split(kind, "it's 'll"), ["it", "'s", " '", "ll"]);
    }

    #[test]
    fn pieces_cover_the_input() {
        let pre = PreTokenizer::new(PreTokenizerKind::Default).expect("patterns compile");
        for text in ["", "a", "  x  ", "café 1234567 ++ <=> 🦀", "\n\n\t x"] {
            assert_eq!(pre.split(text).concat(), text);
        }
    }

    #[test]
    fn llama3_groups_three_digits() {
        assert_eq!(split(PreTokenizerKind::Llama3, "12345"), ["123", "45"]);
        assert_eq!(split(PreTokenizerKind::Qwen2, "12"), ["1", "2"]);
    }

    #[test]
    fn missing_name_is_default_and_merges_follow_the_name() {
        let missing = PreTokenizer::for_gguf_name(None).expect("default");
        assert_eq!(missing.kind(), PreTokenizerKind::Default);
        assert!(!missing.ignore_merges());
        let llama3 = PreTokenizer::for_gguf_name(Some("llama-bpe")).expect("llama-bpe");
        assert!(llama3.ignore_merges());
        // Same regex as Llama 3, but llama.cpp keeps the merge loop for these.
        for name in ["dbrx", "smaug-bpe"] {
            let pre = PreTokenizer::for_gguf_name(Some(name)).expect(name);
            assert_eq!(pre.kind(), PreTokenizerKind::Llama3);
            assert!(!pre.ignore_merges(), "{name}");
        }
    }

    #[test]
    fn unknown_name_falls_back_to_gpt2() {
        let pre = PreTokenizer::for_gguf_name(Some("no-such-pre")).expect("fallback");
        assert_eq!(pre.kind(), PreTokenizerKind::Gpt2);
    }
}
