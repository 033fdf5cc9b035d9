//! The small OpenAI streaming client `shoal bench --url` and `shoal chat --url` share: a JSON POST that
//! turns a failed status into an error, and a reader of the server-sent events it streams back.

use crate::error::BenchError;

/// Sends `body` as JSON with `req` (a POST to `url`); the response if it succeeded, else the server's
/// status and error body as the error.
pub async fn post_json(
    req: reqwest::RequestBuilder,
    url: &str,
    body: &serde_json::Value,
) -> Result<reqwest::Response, BenchError> {
    let resp = req
        .json(body)
        .send()
        .await
        .map_err(|source| BenchError::Connect {
            url: url.to_string(),
            source,
        })?;
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        return Err(BenchError::Status { status, body });
    }
    Ok(resp)
}

/// The `data:` payloads of a streamed response, network chunk by network chunk.
pub struct SseReader {
    resp: reqwest::Response,
    /// Bytes of a line not complete yet.
    buf: Vec<u8>,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buf: Vec::new(),
        }
    }

    /// The payloads the next chunk of the body completes (possibly none); `None` at the end of the body.
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<String>>, BenchError> {
        match self.resp.chunk().await? {
            None => Ok(None),
            Some(bytes) => {
                self.buf.extend_from_slice(&bytes);
                Ok(Some(drain_sse_data(&mut self.buf)))
            }
        }
    }
}

/// One payload as JSON; the server's `error` object as an error.
pub fn parse_chunk(data: &str) -> Result<serde_json::Value, BenchError> {
    let v: serde_json::Value = serde_json::from_str(data).map_err(BenchError::BadChunk)?;
    if let Some(err) = v.get("error") {
        return Err(BenchError::Server(err.clone()));
    }
    Ok(v)
}

/// Splits the complete lines off `buf` and returns the payloads of its `data:` lines (server-sent
/// events), in order; an incomplete last line stays in `buf`.
fn drain_sse_data(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = buf.drain(..=nl).collect();
        let line = String::from_utf8_lossy(&line);
        if let Some(data) = line.trim().strip_prefix("data:") {
            out.push(data.trim().to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_data_lines_are_split_across_chunks() {
        let mut buf = b"data: {\"a\":1}\n\nda".to_vec();
        assert_eq!(drain_sse_data(&mut buf), vec!["{\"a\":1}"]);
        buf.extend_from_slice(b"ta: [DONE]\r\n\r\n: comment\n");
        assert_eq!(drain_sse_data(&mut buf), vec!["[DONE]"]);
        assert!(buf.is_empty());
    }
}
