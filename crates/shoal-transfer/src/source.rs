//! Where chunks come from: the [`ChunkSource`] trait (read a byte range; a name for logs and stats) and
//! [`HttpSource`], a ranged GET on a URL with extra headers (the hub's resolve URL). The peer source, on the
//! blob protocol, is [`crate::peer::PeerSource`].

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_RANGE, HeaderMap, RANGE};

use crate::error::SourceError;

/// Something that can read byte ranges of one file. The fetcher verifies every answer, so a source is
/// trusted for nothing but availability.
pub trait ChunkSource: Send + Sync {
    /// Reads `len` bytes at `offset` (exactly: a shorter answer is an error).
    fn read(&self, offset: u64, len: u64) -> BoxFuture<'_, Result<Bytes, SourceError>>;
    /// A name for logs and progress (a peer id, a host).
    fn name(&self) -> String;
}

/// Ranged GETs on one URL.
pub struct HttpSource {
    client: reqwest::Client,
    url: String,
    headers: HeaderMap,
}

impl HttpSource {
    /// `headers` go with every request (e.g. `Authorization`).
    pub fn new(client: reqwest::Client, url: impl Into<String>, headers: HeaderMap) -> Self {
        Self {
            client,
            url: url.into(),
            headers,
        }
    }

    async fn get(&self, offset: u64, len: u64) -> Result<Bytes, SourceError> {
        let end = offset + len;
        let mut resp = self
            .client
            .get(&self.url)
            .headers(self.headers.clone())
            .header(RANGE, format!("bytes={offset}-{}", end.saturating_sub(1)))
            .send()
            .await
            .map_err(|e| SourceError::Http(e.to_string()))?;
        match resp.status() {
            StatusCode::PARTIAL_CONTENT => {}
            // A 200 is the whole file, not the range: never take it as the range.
            StatusCode::OK => return Err(SourceError::RangeIgnored { start: offset, end }),
            s => {
                return Err(SourceError::Status { status: s.as_u16() });
            }
        }
        let starts_right = resp
            .headers()
            .get(CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.trim().parse::<u64>().ok())
            == Some(offset);
        if !starts_right {
            return Err(SourceError::Protocol(format!(
                "Content-Range does not start at {offset}"
            )));
        }
        // Read at most `len + 1` bytes: a server that sends more is wrong, and never buffered whole.
        let mut body = BytesMut::with_capacity(len as usize);
        while let Some(part) = resp
            .chunk()
            .await
            .map_err(|e| SourceError::Http(e.to_string()))?
        {
            body.extend_from_slice(&part);
            if body.len() as u64 > len {
                break;
            }
        }
        if body.len() as u64 != len {
            return Err(SourceError::Short {
                offset,
                asked: len,
                got: body.len() as u64,
            });
        }
        Ok(body.freeze())
    }
}

impl ChunkSource for HttpSource {
    fn read(&self, offset: u64, len: u64) -> BoxFuture<'_, Result<Bytes, SourceError>> {
        Box::pin(self.get(offset, len))
    }

    fn name(&self) -> String {
        // The URL without its query (signed CDN URLs carry credentials there).
        self.url.split('?').next().unwrap_or_default().to_string()
    }
}
