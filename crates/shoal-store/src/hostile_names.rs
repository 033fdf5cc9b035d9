//! Regression tests of the store's one rule for names (issue 26, items 1 and 3): a model id or name —
//! `..`, `../x`, `/etc/passwd`, empty, NUL, 64 KiB, a folder that is a symbolic link out of the models
//! dir — resolves inside the models dir or is refused, and a delete removes only what shoal wrote.
//! Each test builds a models dir with canary files next to it and behind a link, and checks that they
//! keep their bytes and modification times.

use std::fs;
use std::path::{Path, PathBuf};

use shoal_testkit::tree::{Entry, plant_canaries, snapshot};

use crate::{HubConfig, ModelRef, Store, StoreError};

/// The hostile names every entry point is tried with.
fn hostile() -> Vec<String> {
    vec![
        "..".into(),
        "../x".into(),
        "../outside".into(),
        "/etc/passwd".into(),
        String::new(),
        ".".into(),
        "a\0b".into(),
        "x/../../y".into(),
        "~/x".into(),
        "x.gguf".into(),
        "x".repeat(64 << 10),
    ]
}

/// `<tmp>/models` with one model (`m`), and the canaries next to it: `<tmp>/canary.txt`,
/// `<tmp>/canary/`, and `<tmp>/outside/` (what a model folder holds) linked as `<tmp>/models/evil`
/// ([`plant_canaries`]).
struct Layout {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    models: PathBuf,
}

impl Layout {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let models = root.join("models");
        fs::create_dir_all(models.join("m")).expect("models dir");
        fs::write(models.join("m").join("w.gguf"), b"GGUF weights").expect("model");
        plant_canaries(&root, &models);
        Self {
            _tmp: tmp,
            root,
            models,
        }
    }

    fn store(&self) -> Store {
        let mut hub = HubConfig::from_env();
        hub.cache_dir = self.root.join("hf");
        hub.offline = true;
        Store::new(&self.models).with_hub(hub)
    }

    /// Every path under the root but inside the models dir, with its bytes and modification time.
    fn outside_models(&self) -> Vec<Entry> {
        snapshot(&self.root, std::slice::from_ref(&self.models))
    }
}

#[test]
fn rm_dot_dot_deletes_nothing_outside_the_models_dir() {
    let l = Layout::new();
    let store = l.store();
    let before = l.outside_models();
    for name in hostile() {
        let r = store.remove(&name, false);
        assert!(
            matches!(r, Err(StoreError::BadRef { .. })),
            "{:?}: {r:?}",
            name.chars().take(20).collect::<String>()
        );
        assert!(
            matches!(store.remove(&name, true), Err(StoreError::BadRef { .. })),
            "purge"
        );
    }
    assert_eq!(l.outside_models(), before);
    assert!(
        l.models.join("m").join("w.gguf").is_file(),
        "the model stays"
    );
    assert_eq!(store.present(), vec!["m".to_string()]);
}

#[test]
fn hostile_names_never_become_a_path() {
    let l = Layout::new();
    let store = l.store();
    let before = l.outside_models();
    for name in hostile() {
        let short: String = name.chars().take(20).collect();
        assert!(store.model_dir(&name).is_err(), "{short:?}");
        assert!(
            matches!(store.model_file(&name), Err(StoreError::BadRef { .. })),
            "{short:?}"
        );
        assert!(!store.is_present(&name), "{short:?}");
        assert!(
            store.record_arriving(&name, "x.gguf", 4, None).is_err(),
            "{short:?}"
        );
        assert!(ModelRef::parse_id(&name).is_err(), "{short:?}");
    }
    // A peer's file name is a plain .gguf name too.
    for file in [
        "../x.gguf",
        "model.json",
        ".x.gguf",
        "x.bin",
        "",
        "a\0.gguf",
    ] {
        assert!(
            store.record_arriving("peer-model", file, 4, None).is_err(),
            "{file:?}"
        );
    }
    assert_eq!(l.outside_models(), before);
}

#[test]
fn a_symlinked_folder_leading_out_is_never_read_or_removed() {
    let l = Layout::new();
    let store = l.store();
    let before = l.outside_models();
    assert_eq!(
        store
            .list()
            .iter()
            .map(|e| e.id.as_str())
            .collect::<Vec<_>>(),
        vec!["m"],
        "the linked folder is not listed"
    );
    for r in [
        store.remove("evil", false).map(|_| ()),
        store.remove("evil", true).map(|_| ()),
        store.model_file("evil").map(|_| ()),
        store.record_arriving("evil", "x.gguf", 4, None).map(|_| ()),
        store.model_dir("evil").map(|_| ()),
    ] {
        assert!(matches!(r, Err(StoreError::LinkedFolder { .. })), "{r:?}");
    }
    assert!(!store.is_present("evil"));
    assert_eq!(l.outside_models(), before);
    assert!(l.models.join("evil").is_symlink(), "the link itself stays");
}

#[test]
fn rm_leaves_a_users_extra_file_and_its_folder() {
    let l = Layout::new();
    let store = l.store();
    let dir = l.models.join("m");
    fs::write(dir.join("notes.txt"), b"mine").expect("notes");
    // Another gguf of the user's: the folder's model is the first by name (`w.gguf`), this one stays.
    fs::write(dir.join("zz-draft.gguf"), b"GGUF other").expect("other gguf");
    fs::write(dir.join(".w.gguf.manifest.json"), b"{}").expect("manifest");
    let done = store.remove("m", false).expect("remove");
    assert_eq!(
        done.kept,
        vec![dir.join("notes.txt"), dir.join("zz-draft.gguf")]
    );
    let mut removed = done.removed.clone();
    removed.sort();
    assert_eq!(
        removed,
        vec![dir.join(".w.gguf.manifest.json"), dir.join("w.gguf")]
    );
    assert_eq!(fs::read(dir.join("notes.txt")).expect("notes"), b"mine");
    assert!(dir.join("zz-draft.gguf").is_file());
}

#[test]
fn rm_removes_every_kind_of_file_shoal_writes_and_no_link_target() {
    let l = Layout::new();
    let store = l.store();
    let dir = l.models.join("org--repo--Q4_K_M");
    fs::create_dir(&dir).expect("folder");
    fs::write(
        dir.join("model.json"),
        br#"{"id":"org/repo:Q4_K_M","source":"hub","file":"sub/m.gguf","size":4}"#,
    )
    .expect("model.json");
    let target = l.root.join("canary").join("keep.gguf");
    std::os::unix::fs::symlink(&target, dir.join("m.gguf")).expect("gguf link");
    std::os::unix::fs::symlink(&target, dir.join("m.gguf.partial")).expect("partial link");
    for name in [
        ".model.json.partial",
        ".m.gguf.partial.chunks",
        ".m.gguf.manifest.json",
        ".m.gguf.manifest.json.tmp",
    ] {
        fs::write(dir.join(name), b"x").expect("file");
    }
    fs::create_dir(dir.join(".download.partial")).expect("pip folder");
    fs::write(dir.join(".download.partial").join("w.whl"), b"zip").expect("wheel");
    let before = l.outside_models();
    let done = store.remove("org/repo:Q4_K_M", false).expect("remove");
    assert!(done.kept.is_empty(), "{done:?}");
    assert_eq!(done.removed.last(), Some(&dir));
    assert_eq!(done.removed.len(), 9, "{done:?}");
    assert!(!dir.exists());
    assert_eq!(l.outside_models(), before, "link targets untouched");
}

#[test]
fn purge_with_a_tampered_model_json_stays_in_the_hub_cache() {
    let l = Layout::new();
    let store = l.store();
    let dir = l.models.join("org--repo--Q8_0");
    fs::create_dir(&dir).expect("folder");
    for (commit, file) in [
        ("../../../canary", "keep.gguf"),
        ("abc", "../../../canary.txt"),
    ] {
        let info = format!(
            r#"{{"id":"org/repo:Q8_0","source":"hub","repo":"org/repo","commit":"{commit}","file":"{file}","size":4}}"#
        );
        fs::write(dir.join("model.json"), info).expect("model.json");
        let before = l.outside_models();
        let r = store.remove("org/repo:Q8_0", true);
        assert!(matches!(r, Err(StoreError::BadModelJson { .. })), "{r:?}");
        assert_eq!(l.outside_models(), before);
    }
}

#[test]
fn the_command_line_takes_only_gguf_paths_and_refuses_dot_dot_empty_and_nul() {
    for bad in [
        "..",
        "",
        "   ",
        "a\0b",
        "/etc/passwd",
        "./models",
        "~/notes.txt",
    ] {
        assert!(ModelRef::parse(bad).is_err(), "{bad:?}");
    }
    assert!(ModelRef::parse(&"x".repeat(64 << 10)).is_err());
    assert!(matches!(
        ModelRef::parse("/some/where/x.gguf"),
        Ok(ModelRef::Path(_))
    ));
}

#[test]
fn a_path_from_the_network_gets_the_same_error_whether_or_not_it_exists() {
    let l = Layout::new();
    let existing = l.root.join("canary").join("keep.gguf");
    let missing = l.root.join("canary").join("gone.gguf");
    let why = |p: &Path| match ModelRef::parse_id(&p.display().to_string()) {
        Err(StoreError::BadRef { why, .. }) => why,
        other => panic!("{p:?}: {other:?}"),
    };
    assert_eq!(why(&existing), why(&missing));
    assert!(why(&existing).contains("path"), "{}", why(&existing));
    // Relative and hub-shaped names: decided from the text, never by the disk.
    let rel_existing = ModelRef::parse_id("canary/keep.gguf").map_err(|e| e.to_string());
    let rel_missing = ModelRef::parse_id("canary/gone.gguf").map_err(|e| e.to_string());
    assert!(rel_existing.is_err() && rel_missing.is_err());
    assert!(matches!(
        ModelRef::parse_id("a/b/c.gguf"),
        Ok(ModelRef::Hub(_))
    ));
}
