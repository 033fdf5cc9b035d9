//! Tests that run a real binary: stop it when the test ends, and wait (bounded) until it is ready.

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when the test ends, pass or fail.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `output` (a child's piped stdout or stderr) line by line until one starts with `prefix`, and
/// returns the rest of that line; `None` if no such line came within `timeout` or the output ended.
///
/// A thread keeps reading the output to its end, so the child never blocks on a full pipe.
pub fn line_starting_with(
    output: impl Read + Send + 'static,
    prefix: &str,
    timeout: Duration,
) -> Option<String> {
    // Bound: a few lines of slack while this loop reads them; once it returns the receiver is gone and
    // every send fails at once, so the thread never blocks and goes on draining the pipe.
    let (tx, rx) = std::sync::mpsc::sync_channel(64);
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).ok()?;
        if let Some(rest) = line.strip_prefix(prefix) {
            return Some(rest.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_line_or_gives_up() {
        let out = "starting\nready at 127.0.0.1:9\nmore\n".as_bytes();
        let found = line_starting_with(out, "ready at ", Duration::from_secs(5));
        assert_eq!(found.as_deref(), Some("127.0.0.1:9"));
        let none = line_starting_with("a\nb\n".as_bytes(), "ready", Duration::from_secs(5));
        assert_eq!(none, None);
    }
}
