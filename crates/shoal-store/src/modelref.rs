//! What a user (or a peer) names a model by: [`ModelRef::parse`] turns a command-line argument into a
//! catalog entry, a hub reference ([`HubRef`]: `org/repo[@revision][:QUANT | /file.gguf]`) or the path of
//! a user's own `.gguf` file; [`ModelRef::parse_id`] does the same for a name that arrived over the network
//! (an API request, a peer) and never yields a path nor looks at the file system, so a path-like name is
//! refused the same way whether or not the file exists. [`check_model_id`] is the one rule for a model id:
//! nothing empty, over-long, absolute, path-like, with `..` or control characters — every id that names a
//! folder of the models dir passes it first. A hub model's canonical id ([`HubRef::id`]) parses back to
//! the same reference, so any node can fetch a model from its id alone; [`dir_name`] maps an id to its
//! folder in the models directory. [`select_gguf`] picks the file of a repository that a [`Select`]
//! means, from the repository's file list.

use std::path::PathBuf;

use crate::catalog::{self, CatalogEntry};
use crate::error::StoreError;

/// A model named by a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A gguf file on this machine.
    Path(PathBuf),
    /// A model of the built-in catalog (fetched with pip).
    Catalog(&'static CatalogEntry),
    /// A file of a Hugging Face hub repository.
    Hub(HubRef),
}

/// Which gguf of a hub repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Select {
    /// The gguf whose name carries this quantization tag (`Q4_K_M`), upper-cased.
    Quant(String),
    /// This file (path inside the repository).
    File(String),
    /// `Q4_K_M` when the repository has it, else its only gguf.
    Auto,
}

/// A model file on the hub, as named (the file itself may still have to be chosen from the listing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    /// `org/repo`.
    pub repo: String,
    /// Branch, tag or commit; `main` when not named.
    pub revision: String,
    pub select: Select,
}

/// The tag [`Select::Auto`] prefers.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

impl ModelRef {
    /// Parses a model argument of the command line: a path (one starting with `/`, `.` or `~`, a bare
    /// `name.gguf`, or an existing `dir/name.gguf`) — which must name a `.gguf` file — else a model id
    /// ([`ModelRef::parse_id`]). Empty text, control characters (NUL) and text longer than
    /// [`MAX_NAME_LEN`] are refused.
    pub fn parse(s: &str) -> Result<ModelRef, StoreError> {
        let s = s.trim();
        let bad = |why: &str| StoreError::BadRef {
            text: s.chars().take(80).collect(),
            why: why.into(),
        };
        if s.is_empty() {
            return Err(bad("empty model name"));
        }
        if s.len() > MAX_NAME_LEN {
            return Err(bad("longer than 4096 bytes"));
        }
        if s.chars().any(char::is_control) {
            return Err(bad("control characters (NUL, newline) in a model name"));
        }
        let gguf = s.to_ascii_lowercase().ends_with(".gguf");
        if shoal_ids::looks_like_path(s) || (gguf && std::path::Path::new(s).exists()) {
            if !gguf {
                return Err(bad(
                    "a model path must name a .gguf file (a model id names no path)",
                ));
            }
            return Ok(ModelRef::Path(expand_home(s)));
        }
        Self::parse_id(s)
    }

    /// Parses a model name that arrived over the network (an API request, a peer's message): a catalog
    /// id or a hub reference, never a path. Pure: it never looks at the file system, so a path-like name
    /// gets the same error whether or not such a file exists. The name must pass [`check_model_id`].
    pub fn parse_id(s: &str) -> Result<ModelRef, StoreError> {
        check_model_id(s)?;
        if let Some(e) = catalog::find(s) {
            return Ok(ModelRef::Catalog(e));
        }
        if !s.contains('/') {
            return Err(StoreError::UnknownModel(s.into()));
        }
        HubRef::parse(s).map(ModelRef::Hub)
    }

    /// The id the model is known by: the catalog id, the hub id, or a path's file stem (lower case).
    pub fn id(&self) -> String {
        match self {
            ModelRef::Path(p) => p
                .file_stem()
                .map(|s| s.to_string_lossy().to_lowercase())
                .unwrap_or_default(),
            ModelRef::Catalog(e) => e.id.to_string(),
            ModelRef::Hub(h) => h.id(),
        }
    }
}

fn expand_home(s: &str) -> PathBuf {
    match (s.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(s),
    }
}

/// The longest model name [`ModelRef::parse`] takes (a path may be long; an id is at most
/// [`MAX_ID_LEN`] bytes).
pub const MAX_NAME_LEN: usize = 4096;

/// The longest model id [`check_model_id`] takes.
pub const MAX_ID_LEN: usize = shoal_ids::MAX_MODEL_ID_LEN;

/// A file path inside a hub repository that stays inside it: `/`-separated names of letters, digits,
/// `-`, `_` and `.`, none of them `.` or `..`.
pub(crate) fn valid_repo_path(f: &str) -> bool {
    f.split('/').all(valid_name)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl HubRef {
    /// Parses `org/repo[@revision][:QUANT | /path/file.gguf]`.
    pub fn parse(s: &str) -> Result<HubRef, StoreError> {
        let bad = |why: &str| StoreError::BadRef {
            text: s.into(),
            why: why.into(),
        };
        let (org, rest) = s.split_once('/').ok_or_else(|| bad("expected org/repo"))?;
        let end = rest.find(['@', ':', '/']).unwrap_or(rest.len());
        let (name, mut rest) = rest.split_at(end);
        if !valid_name(org) || !valid_name(name) {
            return Err(bad(
                "org and repo may hold letters, digits, '-', '_' and '.'",
            ));
        }
        let mut revision = "main".to_string();
        if let Some(r) = rest.strip_prefix('@') {
            let end = r.find([':', '/']).unwrap_or(r.len());
            if end == 0 {
                return Err(bad("empty revision after '@'"));
            }
            if !valid_name(&r[..end]) {
                return Err(bad(
                    "a revision holds letters, digits, '-', '_' and '.' (not '..')",
                ));
            }
            revision = r[..end].to_string();
            rest = &r[end..];
        }
        let select = if rest.is_empty() {
            Select::Auto
        } else if let Some(q) = rest.strip_prefix(':') {
            if q.is_empty() || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad("a quantization tag holds letters, digits and '_'"));
            }
            Select::Quant(q.to_ascii_uppercase())
        } else if let Some(f) = rest.strip_prefix('/') {
            if !f.to_ascii_lowercase().ends_with(".gguf") {
                return Err(bad("the file must be a .gguf"));
            }
            if !valid_repo_path(f) {
                return Err(bad("bad file path"));
            }
            check_not_split(f)?;
            Select::File(f.to_string())
        } else {
            return Err(bad("expected ':QUANT' or '/file.gguf' after the repo"));
        };
        Ok(HubRef {
            repo: format!("{org}/{name}"),
            revision,
            select,
        })
    }

    /// The canonical id: `org/repo[@rev][:QUANT | /file]` (`@main` left out). Parses back to `self`.
    pub fn id(&self) -> String {
        let mut s = self.repo.clone();
        if self.revision != "main" {
            s.push('@');
            s.push_str(&self.revision);
        }
        match &self.select {
            Select::Quant(q) => {
                s.push(':');
                s.push_str(q);
            }
            Select::File(f) => {
                s.push('/');
                s.push_str(f);
            }
            Select::Auto => {}
        }
        s
    }
}

/// Checks that `id` is a model id that names a folder of the models dir ([`dir_name`]) and nothing else:
/// not empty, at most [`MAX_ID_LEN`] bytes (and a folder name of at most 255), not a path (a leading `/`,
/// `.` or `~`, a `..` or `.` part, a bare `name.gguf`), no backslashes or control characters (NUL). The
/// one rule every id goes through before it names a folder: the store's lookups and deletes, the
/// node's downloads and the API's routes. Decided from the text alone.
pub fn check_model_id(id: &str) -> Result<(), StoreError> {
    shoal_ids::ModelId::parse(id)
        .map(drop)
        .map_err(|e| StoreError::BadRef {
            text: id.chars().take(80).collect(),
            why: match e {
                shoal_ids::IdError::Model { why, .. } => format!("not a model id: {why}"),
                other => other.to_string(),
            },
        })
}

/// The models-dir folder of a model id: the id with `/` and `:` replaced by `--` (catalog ids unchanged).
pub use shoal_ids::dir_name;

/// `-00001-of-00003.gguf`: a model split over several files (not supported yet).
fn is_split(file: &str) -> bool {
    let lower = file.to_ascii_lowercase();
    let Some(stem) = lower.strip_suffix(".gguf") else {
        return false;
    };
    let b = stem.as_bytes();
    // "-NNNNN-of-NNNNN" is 15 bytes.
    b.len() >= 15 && {
        let t = &b[b.len() - 15..];
        t[0] == b'-'
            && t[1..6].iter().all(u8::is_ascii_digit)
            && &t[6..10] == b"-of-"
            && t[10..].iter().all(u8::is_ascii_digit)
    }
}

fn check_not_split(file: &str) -> Result<(), StoreError> {
    if is_split(file) {
        return Err(StoreError::SplitGguf(file.into()));
    }
    Ok(())
}

/// How `tag` occurs in `file`'s name: `Some(true)` delimited on both sides (`-Q4_K_M.gguf`), `Some(false)`
/// only as a prefix of a longer tag (`Q4_K` in `Q4_K_M`), `None` not at all.
fn tag_match(file: &str, tag: &str) -> Option<bool> {
    let name = file.rsplit('/').next().unwrap_or(file).to_ascii_lowercase();
    let tag = tag.to_ascii_lowercase();
    let delim = |c: Option<char>| c.is_none_or(|c| matches!(c, '-' | '.' | '_'));
    let mut best = None;
    for (i, _) in name.match_indices(&tag) {
        let before = name[..i].chars().next_back();
        let after = name[i + tag.len()..].chars().next();
        if !delim(before) || !delim(after) {
            continue;
        }
        let exact = after != Some('_');
        best = Some(best.unwrap_or(false) || exact);
    }
    best
}

/// The gguf of a repository's `files` that `select` means. Multimodal projectors (`mmproj*`) are not
/// models; split ggufs are refused.
pub fn select_gguf(repo: &str, files: &[String], select: &Select) -> Result<String, StoreError> {
    let ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| {
            !f.rsplit('/')
                .next()
                .unwrap_or(f)
                .to_ascii_lowercase()
                .starts_with("mmproj")
        })
        .collect();
    let listing = || {
        ggufs
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let pick_tag = |tag: &str| -> Result<Option<String>, StoreError> {
        let exact: Vec<&&String> = ggufs
            .iter()
            .filter(|f| tag_match(f, tag) == Some(true))
            .collect();
        let loose: Vec<&&String> = ggufs
            .iter()
            .filter(|f| tag_match(f, tag).is_some())
            .collect();
        let found = if exact.is_empty() { loose } else { exact };
        match found.as_slice() {
            [] => Ok(None),
            [one] => {
                check_not_split(one)?;
                Ok(Some(one.to_string()))
            }
            many if many.iter().all(|f| is_split(f)) => {
                Err(StoreError::SplitGguf(many[0].to_string()))
            }
            many => Err(StoreError::AmbiguousGguf {
                repo: repo.into(),
                what: tag.into(),
                files: many
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    };
    match select {
        Select::File(f) => {
            check_not_split(f)?;
            if files.iter().any(|x| x == f) {
                Ok(f.clone())
            } else {
                Err(StoreError::FileNotInRepo {
                    repo: repo.into(),
                    file: f.clone(),
                    files: listing(),
                })
            }
        }
        Select::Quant(tag) => pick_tag(tag)?.ok_or_else(|| StoreError::NoMatchingGguf {
            repo: repo.into(),
            what: format!("quantization {tag}"),
            files: listing(),
        }),
        Select::Auto => {
            if let Some(f) = pick_tag(DEFAULT_QUANT)? {
                return Ok(f);
            }
            match ggufs.as_slice() {
                [one] => {
                    check_not_split(one)?;
                    Ok(one.to_string())
                }
                [] => Err(StoreError::NoMatchingGguf {
                    repo: repo.into(),
                    what: "any .gguf".into(),
                    files: files.join(", "),
                }),
                _ => Err(StoreError::AmbiguousGguf {
                    repo: repo.into(),
                    what: format!("no {DEFAULT_QUANT}; name a tag (:Q8_0) or a file"),
                    files: listing(),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_that_could_leave_the_models_dir_are_refused() {
        // The rule itself is shoal_ids::ModelId's (its tests list the cases); here, that the store
        // applies it and says why in its own error.
        assert!(check_model_id("org/repo:Q4_K_M").is_ok());
        for bad in ["..", "org/../x", "/etc/passwd", "x.gguf"] {
            let err = check_model_id(bad).unwrap_err();
            assert!(
                matches!(&err, StoreError::BadRef { why, .. } if why.starts_with("not a model id")),
                "{bad:?}: {err}"
            );
        }
        assert!(HubRef::parse("org/repo@..:Q4_K_M").is_err());
    }

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_the_three_kinds() {
        assert!(matches!(
            ModelRef::parse("gemma3-270m-q4_k_m").unwrap(),
            ModelRef::Catalog(e) if e.id == "gemma3-270m-q4_k_m"
        ));
        assert_eq!(
            ModelRef::parse("/tmp/x.gguf").unwrap(),
            ModelRef::Path("/tmp/x.gguf".into())
        );
        assert_eq!(
            ModelRef::parse("x.gguf").unwrap(),
            ModelRef::Path("x.gguf".into())
        );
        let h = ModelRef::parse("bartowski/Llama-3.2-1B-Instruct-GGUF:q4_k_m").unwrap();
        assert_eq!(
            h,
            ModelRef::Hub(HubRef {
                repo: "bartowski/Llama-3.2-1B-Instruct-GGUF".into(),
                revision: "main".into(),
                select: Select::Quant("Q4_K_M".into()),
            })
        );
        let f = HubRef::parse(
            "Qwen/Qwen2.5-0.5B-Instruct-GGUF@v1.0/sub/qwen2.5-0.5b-instruct-q4_k_m.gguf",
        )
        .unwrap();
        assert_eq!(f.revision, "v1.0");
        assert_eq!(
            f.select,
            Select::File("sub/qwen2.5-0.5b-instruct-q4_k_m.gguf".into())
        );
        assert_eq!(HubRef::parse("a/b").unwrap().select, Select::Auto);
        assert!(matches!(
            ModelRef::parse("nonsense"),
            Err(StoreError::UnknownModel(_))
        ));
        for bad in ["a/b:", "a/b@", "a/b/c.txt", "a/b:Q4-K", "/", "a b/c"] {
            assert!(HubRef::parse(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            HubRef::parse("a/b/m-00001-of-00002.gguf"),
            Err(StoreError::SplitGguf(_))
        ));
    }

    #[test]
    fn canonical_ids_round_trip() {
        for id in [
            "org/repo:Q4_K_M",
            "org/repo@dev:Q8_0",
            "org/repo/dir/file.gguf",
            "org/repo",
        ] {
            let h = HubRef::parse(id).unwrap();
            assert_eq!(h.id(), id);
            assert_eq!(HubRef::parse(&h.id()).unwrap(), h);
        }
        assert_eq!(HubRef::parse("o/r@main:q8_0").unwrap().id(), "o/r:Q8_0");
        assert_eq!(dir_name("org/repo:Q4_K_M"), "org--repo--Q4_K_M");
        assert_eq!(dir_name("gemma3-270m-q4_k_m"), "gemma3-270m-q4_k_m");
    }

    #[test]
    fn quant_tags_pick_the_delimited_file() {
        let repo = files(&[
            "README.md",
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
            "Llama-3.2-1B-Instruct-Q4_K_S.gguf",
            "Llama-3.2-1B-Instruct-Q8_0.gguf",
            "Llama-3.2-1B-Instruct-IQ4_XS.gguf",
            "mmproj-f16.gguf",
        ]);
        let q = |t: &str| select_gguf("o/r", &repo, &Select::Quant(t.into()));
        assert_eq!(q("Q4_K_M").unwrap(), "Llama-3.2-1B-Instruct-Q4_K_M.gguf");
        assert_eq!(q("q8_0").unwrap(), "Llama-3.2-1B-Instruct-Q8_0.gguf");
        // "Q4_K" is a prefix of two tags: ambiguous, and the message lists them.
        let e = q("Q4_K").unwrap_err().to_string();
        assert!(
            e.contains("Q4_K_M.gguf") && e.contains("Q4_K_S.gguf"),
            "{e}"
        );
        // "XS" inside IQ4_XS is delimited by '_' before it and '.' after: it matches.
        assert_eq!(q("XS").unwrap(), "Llama-3.2-1B-Instruct-IQ4_XS.gguf");
        assert!(matches!(
            q("Q5_K_M"),
            Err(StoreError::NoMatchingGguf { .. })
        ));
        assert_eq!(
            select_gguf("o/r", &repo, &Select::Auto).unwrap(),
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf"
        );
        let one = files(&["model.Q8_0.gguf", "mmproj-model.gguf"]);
        assert_eq!(
            select_gguf("o/r", &one, &Select::Auto).unwrap(),
            "model.Q8_0.gguf"
        );
        let two = files(&["a.Q8_0.gguf", "a.F16.gguf"]);
        assert!(matches!(
            select_gguf("o/r", &two, &Select::Auto),
            Err(StoreError::AmbiguousGguf { .. })
        ));
        let split = files(&[
            "m-Q4_K_M-00001-of-00002.gguf",
            "m-Q4_K_M-00002-of-00002.gguf",
        ]);
        assert!(matches!(
            select_gguf("o/r", &split, &Select::Auto),
            Err(StoreError::SplitGguf(_))
        ));
        assert!(matches!(
            select_gguf("o/r", &repo, &Select::File("nope.gguf".into())),
            Err(StoreError::FileNotInRepo { .. })
        ));
    }
}
