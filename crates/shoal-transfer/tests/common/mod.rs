//! What the transfer tests share: [`MemSource`], an in-memory chunk source that can misbehave.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use shoal_transfer::{ChunkSource, SourceError};

/// An in-memory file that can flip a byte of everything it serves, fail after some reads, or be slow.
pub struct MemSource {
    pub name: &'static str,
    pub data: Arc<Vec<u8>>,
    pub corrupt: bool,
    pub fail_after: Option<usize>,
    pub delay: Duration,
    pub reads: AtomicUsize,
    pub offsets: Mutex<Vec<u64>>,
}

impl MemSource {
    pub fn new(name: &'static str, data: &Arc<Vec<u8>>) -> Self {
        Self {
            name,
            data: data.clone(),
            corrupt: false,
            fail_after: None,
            delay: Duration::ZERO,
            reads: AtomicUsize::new(0),
            offsets: Mutex::new(Vec::new()),
        }
    }

    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl ChunkSource for MemSource {
    fn read(&self, offset: u64, len: u64) -> BoxFuture<'_, Result<Bytes, SourceError>> {
        Box::pin(async move {
            let n = self.reads.fetch_add(1, Ordering::SeqCst);
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            if self.fail_after.is_some_and(|k| n >= k) {
                return Err(SourceError::Closed);
            }
            self.offsets.lock().unwrap().push(offset);
            let mut b = self.data[offset as usize..(offset + len) as usize].to_vec();
            if self.corrupt {
                b[len as usize / 2] ^= 0x40;
            }
            Ok(Bytes::from(b))
        })
    }

    fn name(&self) -> String {
        self.name.into()
    }
}
