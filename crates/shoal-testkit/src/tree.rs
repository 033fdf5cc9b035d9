//! What a folder holds, for tests that must prove a command left a part of the disk alone: [`snapshot`]
//! records every path below a folder (links not followed) with its bytes and modification time; two
//! snapshots compare equal when nothing was written, deleted or added there. [`plant_canaries`] lays
//! out the canary files of a hostile-name test next to a models dir, and a folder linked out of it.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// One path of a [`snapshot`]: its bytes (empty for a folder or a link) and its modification time.
pub type Entry = (PathBuf, Vec<u8>, SystemTime);

/// Every path below `root` but those below the folders in `skip`, sorted, links recorded as links (not
/// followed). Panics (a test failure) when the folder cannot be read.
pub fn snapshot(root: &Path, skip: &[PathBuf]) -> Vec<Entry> {
    let mut out = Vec::new();
    walk(root, skip, &mut out);
    out.sort();
    out
}

fn walk(dir: &Path, skip: &[PathBuf], out: &mut Vec<Entry>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries.flatten() {
        let p = e.path();
        if skip.contains(&p) {
            continue;
        }
        let meta = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if meta.is_dir() {
            out.push((p.clone(), Vec::new(), mtime));
            walk(&p, skip, out);
        } else if meta.is_file() {
            out.push((p.clone(), fs::read(&p).unwrap_or_default(), mtime));
        } else {
            out.push((p, Vec::new(), mtime));
        }
    }
}

/// The name of the folder of the models dir that [`plant_canaries`] links out of it.
pub const LINK_OUT: &str = "evil";

/// Plants, next to the models dir `models` (a folder directly in `root`), what a test of hostile model
/// names checks stays untouched: `<root>/canary.txt`, `<root>/canary/keep.gguf`, and `<root>/outside/`
/// holding what a model folder holds (`model.json` naming the id `evil`, `x.gguf`, `x.gguf.partial`),
/// linked from the models dir as `<models>/evil` ([`LINK_OUT`]).
pub fn plant_canaries(root: &Path, models: &Path) {
    let write = |p: PathBuf, bytes: &[u8]| {
        fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let mkdir =
        |p: PathBuf| fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    mkdir(models.to_path_buf());
    write(root.join("canary.txt"), b"canary");
    mkdir(root.join("canary"));
    write(root.join("canary").join("keep.gguf"), b"GGUF keep");
    let outside = root.join("outside");
    mkdir(outside.clone());
    write(
        outside.join("model.json"),
        br#"{"id":"evil","source":"path","file":"x.gguf","size":4}"#,
    );
    write(outside.join("x.gguf"), b"GGUF");
    write(outside.join("x.gguf.partial"), b"part");
    std::os::unix::fs::symlink(&outside, models.join(LINK_OUT))
        .unwrap_or_else(|e| panic!("linking {LINK_OUT}: {e}"));
}
