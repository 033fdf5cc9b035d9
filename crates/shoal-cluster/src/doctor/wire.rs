//! The doctor protocol (`/shoal/doctor/1`), one stream per measurement, opened by the node that runs
//! `shoal doctor`; the first byte says which:
//!
//! - [`OP_PING`]: then, repeatedly, the client writes a sequence number (u32) and the peer answers it
//!   with its wall clock (u32 sequence + i64 Unix nanoseconds). A late answer is recognised by its
//!   number and skipped.
//! - [`OP_UPLOAD`]: the client streams bytes and closes its side; the peer answers how many bytes came
//!   and the microseconds from the first to the last (u64 + u64).
//! - [`OP_DOWNLOAD`]: the client asks for `millis` (u32) and at most `cap` bytes (u64); the peer streams
//!   that long (bounded by [`MAX_SEND_FOR`] and [`MAX_SEND_BYTES`]) and closes.
//!
//! All integers little-endian. The answering side ([`answer`]) bounds every stream by
//! [`STREAM_LIMIT`], so a peer that stops reading or writing cannot hold a task for long.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::DoctorError;
use super::stats::{Answer, Ping};

pub const OP_PING: u8 = 1;
pub const OP_UPLOAD: u8 = 2;
pub const OP_DOWNLOAD: u8 = 3;

/// The longest a peer streams for one download request, and the most bytes.
pub const MAX_SEND_FOR: Duration = Duration::from_secs(10);
pub const MAX_SEND_BYTES: u64 = 1 << 30;
/// The longest one doctor stream lives on the answering side.
pub const STREAM_LIMIT: Duration = Duration::from_secs(60);
/// Bytes per write of a transfer.
const CHUNK: usize = 64 << 10;

/// Nanoseconds since the Unix epoch by this machine's wall clock (negative before it).
pub fn unix_ns() -> i128 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// Answers one doctor stream (the op byte first), within [`STREAM_LIMIT`].
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> Result<(), DoctorError> {
    let work = async {
        let mut op = [0u8; 1];
        stream.read_exact(&mut op).await?;
        match op[0] {
            OP_PING => answer_pings(&mut stream).await,
            OP_UPLOAD => answer_upload(&mut stream).await,
            OP_DOWNLOAD => answer_download(&mut stream).await,
            other => Err(DoctorError::Protocol {
                message: format!("unknown doctor operation {other}"),
            }),
        }
    };
    tokio::time::timeout(STREAM_LIMIT, work)
        .await
        .map_err(|_| DoctorError::Timeout {
            what: "answering a doctor stream",
        })?
}

async fn answer_pings<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> Result<(), DoctorError> {
    let mut seq = [0u8; 4];
    loop {
        match stream.read_exact(&mut seq).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let mut reply = [0u8; 12];
        reply[..4].copy_from_slice(&seq);
        reply[4..].copy_from_slice(&(unix_ns() as i64).to_le_bytes());
        stream.write_all(&reply).await?;
        stream.flush().await?;
    }
}

async fn answer_upload<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> Result<(), DoctorError> {
    let (total, span) = read_timed(stream).await?;
    let us = span.as_micros() as u64;
    let mut reply = [0u8; 16];
    reply[..8].copy_from_slice(&total.to_le_bytes());
    reply[8..].copy_from_slice(&us.to_le_bytes());
    stream.write_all(&reply).await?;
    stream.close().await?;
    Ok(())
}

async fn answer_download<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> Result<(), DoctorError> {
    let mut ask = [0u8; 12];
    stream.read_exact(&mut ask).await?;
    let millis = u32::from_le_bytes([ask[0], ask[1], ask[2], ask[3]]);
    let mut cap = [0u8; 8];
    cap.copy_from_slice(&ask[4..]);
    let cap = u64::from_le_bytes(cap).min(MAX_SEND_BYTES);
    let send_for = Duration::from_millis(millis.into()).min(MAX_SEND_FOR);
    send_for_a_while(stream, send_for, cap).await?;
    stream.close().await?;
    Ok(())
}

/// Writes chunks for `send_for` or until `cap` bytes went; returns the bytes written.
async fn send_for_a_while<S: AsyncWrite + Unpin>(
    stream: &mut S,
    send_for: Duration,
    cap: u64,
) -> Result<u64, DoctorError> {
    let chunk = vec![0xA5u8; CHUNK];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < cap && start.elapsed() < send_for {
        stream.write_all(&chunk).await?;
        sent += CHUNK as u64;
    }
    stream.flush().await?;
    Ok(sent)
}

/// Sends `count` pings `interval` apart on a ping stream, each waiting `timeout` for its answer; stops
/// early (counting the rest as lost) after three losses in a row. The pings, in order.
pub async fn ping<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    count: usize,
    interval: Duration,
    timeout: Duration,
) -> Result<Vec<Ping>, DoctorError> {
    stream.write_all(&[OP_PING]).await?;
    let mut pings = Vec::with_capacity(count);
    let mut lost_in_a_row = 0;
    for seq in 0..count as u32 {
        if lost_in_a_row >= 3 {
            pings.push(Ping {
                sent_unix_ns: unix_ns(),
                answer: None,
            });
            continue;
        }
        let sent_unix_ns = unix_ns();
        let sent = Instant::now();
        stream.write_all(&seq.to_le_bytes()).await?;
        stream.flush().await?;
        let answer = match tokio::time::timeout(timeout, read_answer(stream, seq)).await {
            Ok(Ok(peer_unix_ns)) => Some(Answer {
                rtt: sent.elapsed(),
                peer_unix_ns,
            }),
            Ok(Err(e)) => return Err(e),
            Err(_) => None,
        };
        lost_in_a_row = if answer.is_some() {
            0
        } else {
            lost_in_a_row + 1
        };
        pings.push(Ping {
            sent_unix_ns,
            answer,
        });
        if answer.is_some() && seq + 1 < count as u32 {
            tokio::time::sleep(interval).await;
        }
    }
    Ok(pings)
}

/// Reads answers until the one to `seq` (earlier, late ones are skipped); its peer time.
async fn read_answer<S: AsyncRead + Unpin>(stream: &mut S, seq: u32) -> Result<i128, DoctorError> {
    loop {
        let mut reply = [0u8; 12];
        stream.read_exact(&mut reply).await?;
        let got = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]);
        if got == seq {
            let mut t = [0u8; 8];
            t.copy_from_slice(&reply[4..]);
            return Ok(i64::from_le_bytes(t).into());
        }
    }
}

/// Streams bytes to the peer for `send_for` (at most `cap`); the bytes the peer timed and how long
/// they took from its first read to its last.
pub async fn upload<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    send_for: Duration,
    cap: u64,
) -> Result<(u64, Duration), DoctorError> {
    stream.write_all(&[OP_UPLOAD]).await?;
    send_for_a_while(stream, send_for, cap).await?;
    stream.close().await?;
    let mut reply = [0u8; 16];
    stream.read_exact(&mut reply).await?;
    let (mut bytes, mut us) = ([0u8; 8], [0u8; 8]);
    bytes.copy_from_slice(&reply[..8]);
    us.copy_from_slice(&reply[8..]);
    Ok((
        u64::from_le_bytes(bytes),
        Duration::from_micros(u64::from_le_bytes(us)),
    ))
}

/// Asks the peer to stream for `send_for` (at most `cap` bytes) and reads until it closes; the bytes
/// after the first read and how long they took from the first read to the last.
pub async fn download<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    send_for: Duration,
    cap: u64,
) -> Result<(u64, Duration), DoctorError> {
    let mut ask = [0u8; 13];
    ask[0] = OP_DOWNLOAD;
    let millis = u32::try_from(send_for.as_millis()).unwrap_or(u32::MAX);
    ask[1..5].copy_from_slice(&millis.to_le_bytes());
    ask[5..].copy_from_slice(&cap.to_le_bytes());
    stream.write_all(&ask).await?;
    stream.flush().await?;
    read_timed(stream).await
}

/// Reads until the other side closes: the bytes after the first read (which arrived before the clock
/// started, so are not timed) and the time from the first read to the last.
async fn read_timed<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(u64, Duration), DoctorError> {
    let mut buf = vec![0u8; CHUNK];
    let (mut total, mut first, mut last) = (0u64, None, None);
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let now = Instant::now();
        if first.is_none() {
            first = Some(now);
        } else {
            total += n as u64;
        }
        last = Some(now);
    }
    let span = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f),
        _ => Duration::ZERO,
    };
    Ok((total, span))
}

#[cfg(test)]
mod tests {
    use tokio_util::compat::{Compat, TokioAsyncReadCompatExt};

    use super::*;

    type Pipe = Compat<tokio::io::DuplexStream>;

    /// Runs `client` against [`answer`] over an in-memory pipe; the client's result and the answer's.
    async fn over_pipe<T>(
        client: impl AsyncFnOnce(&mut Pipe) -> Result<T, DoctorError>,
    ) -> (T, Result<(), DoctorError>) {
        let (a, b) = tokio::io::duplex(256 << 10);
        let server = tokio::spawn(answer(b.compat()));
        let mut a = a.compat();
        let out = client(&mut a).await.expect("client side");
        drop(a);
        (out, server.await.expect("answer task"))
    }

    #[tokio::test]
    async fn pings_are_answered_with_the_peers_clock() {
        let before = unix_ns();
        let (pings, answered) =
            over_pipe(async |s| ping(s, 5, Duration::ZERO, Duration::from_secs(2)).await).await;
        answered.expect("answered");
        assert_eq!(pings.len(), 5);
        for p in &pings {
            let a = p.answer.expect("answered in time");
            assert!(a.peer_unix_ns >= before && a.peer_unix_ns <= unix_ns());
            assert!(a.rtt < Duration::from_secs(2));
        }
    }

    #[tokio::test]
    async fn an_upload_is_timed_by_the_receiver_and_a_download_by_the_reader() {
        let cap = 8 * CHUNK as u64;
        let ((bytes, took), answered) =
            over_pipe(async |s| upload(s, Duration::from_secs(5), cap).await).await;
        answered.expect("answered");
        // The first read is not timed; everything after it is.
        assert!(bytes > 0 && bytes < cap, "{bytes}");
        assert!(took < Duration::from_secs(5));
        let ((bytes, _), answered) =
            over_pipe(async |s| download(s, Duration::from_secs(5), cap).await).await;
        answered.expect("answered");
        assert!(bytes > 0 && bytes < cap, "{bytes}");
    }

    #[tokio::test]
    async fn a_peer_that_never_answers_loses_every_ping_quickly() {
        let (a, _b) = tokio::io::duplex(1024);
        let mut a = a.compat();
        let t0 = Instant::now();
        let pings = ping(&mut a, 50, Duration::ZERO, Duration::from_millis(50))
            .await
            .expect("pings");
        assert_eq!(pings.len(), 50);
        assert!(pings.iter().all(|p| p.answer.is_none()));
        // Three timeouts in a row end the series: not 50 of them.
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn an_unknown_operation_is_refused() {
        let (a, b) = tokio::io::duplex(1024);
        let server = tokio::spawn(answer(b.compat()));
        let mut a = a.compat();
        a.write_all(&[9]).await.expect("write");
        let err = server.await.expect("task").expect_err("refused");
        assert_eq!(
            err.to_string(),
            "the peer broke the doctor protocol: unknown doctor operation 9"
        );
    }
}
