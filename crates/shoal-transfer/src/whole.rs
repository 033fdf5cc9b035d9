//! [`WholeHasher`]: the whole-file sha256 of a download, computed while it arrives.
//!
//! A thread of its own hashes the chunks in file order as soon as each is verified and written (reading
//! them back while they are still in the page cache), so a finished download needs no second pass over
//! the whole file. Chunks arrive roughly in order (the fetcher queues them so), so the thread keeps up.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::mpsc;

use sha2::{Digest, Sha256};

use crate::manifest::{Manifest, hex};

pub(crate) struct WholeHasher {
    /// Chunk indices as they are verified. Unbounded: one `usize` per chunk of the file at most.
    tx: mpsc::Sender<usize>,
    thread: std::thread::JoinHandle<Option<String>>,
}

impl WholeHasher {
    /// Starts hashing `file`; `present[i]` says chunk `i` is already verified.
    pub fn start(file: File, manifest: Arc<Manifest>, present: Vec<bool>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<usize>();
        let thread = std::thread::Builder::new()
            .name("shoal-whole-sha256".into())
            .spawn(move || hash_in_order(&file, &manifest, present, &rx))?;
        Ok(Self { tx, thread })
    }

    /// Chunk `i` is verified and written.
    pub fn landed(&self, i: usize) {
        // The thread stops early only after a read error; `finish` then says so.
        let _ = self.tx.send(i);
    }

    /// The whole file's sha256, or `None` when the thread could not hash every chunk (a read failed, or
    /// chunks are missing).
    pub async fn finish(self) -> Option<String> {
        drop(self.tx);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join().ok().flatten())
            .await
            .ok()
            .flatten()
    }
}

fn hash_in_order(
    file: &File,
    m: &Manifest,
    mut present: Vec<bool>,
    rx: &mpsc::Receiver<usize>,
) -> Option<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; m.chunk_size as usize];
    let mut next = 0;
    loop {
        while next < present.len() && present[next] {
            let r = m.chunk_range(next);
            let n = (r.end - r.start) as usize;
            if file.read_exact_at(&mut buf[..n], r.start).is_err() {
                return None;
            }
            h.update(&buf[..n]);
            next += 1;
        }
        match rx.recv() {
            Ok(i) => {
                if let Some(p) = present.get_mut(i) {
                    *p = true;
                }
            }
            Err(_) => break,
        }
    }
    (next == present.len()).then(|| hex(&h.finalize()))
}
