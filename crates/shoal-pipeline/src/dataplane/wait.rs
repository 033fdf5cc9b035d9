//! Waiting for a lane's next bytes without paying a sleeping thread's wakeup.
//!
//! A thread blocked in `poll(2)` on an idle CPU wakes tens to hundreds of microseconds after its bytes
//! arrive (the CPU left its idle state; on a VM the host must run the vCPU again), and in a pipeline
//! that happens at every hop of every token. But a stage knows when its input is due: in steady decode
//! the wait for the next step's bytes is about the same every time (the other stages' compute). So a
//! [`Pacer`] learns the usual wait (a smoothed figure of recent ones) and a wait goes in three parts:
//! sleep in `ppoll` until a lead before the input is due, then poll without sleeping for twice that
//! lead (the thread stays on its CPU and sees the bytes the moment they land), then sleep until they
//! come. The lead is a share of the wait with a cap, so a machine whose other stages share its cores
//! loses part of it only, and waits much longer than a step (an idle pipeline) are not learnt: those
//! sleep.
//! `SHOAL_LANE_SPIN=0` in a node's environment makes every wait sleep (decision 015 has the figures).

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Waits longer than this are not a step's (an idle pipeline, a prompt's prefill): not learnt.
const LEARN_BELOW: Duration = Duration::from_millis(200);
/// Polling starts this share of the usual wait before the input is due, …
const LEAD_SHARE: f64 = 0.3;
/// … within these bounds, and goes on as long again after it. A lead under a millisecond loses much of
/// the gain on a VM: a vCPU that just woke from idle runs the next syscalls slowly (decision 015).
const LEAD_MIN: Duration = Duration::from_micros(100);
const LEAD_MAX: Duration = Duration::from_millis(2);
/// Weight of the newest wait in the usual one.
const SMOOTHING: f64 = 0.25;

/// What a wait found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ready {
    /// The input has bytes (or was closed: the read says which).
    Input,
    /// The watched socket is readable: its peer closed it or it broke.
    Watched,
    /// The deadline passed.
    Neither,
}

/// The usual wait for a lane's input, learnt from the last ones.
#[derive(Debug, Default)]
pub(super) struct Pacer {
    usual: Option<Duration>,
    /// Whether to poll before the input is due at all (`SHOAL_LANE_SPIN=0` turns it off).
    off: bool,
}

impl Pacer {
    pub fn new() -> Self {
        Self {
            usual: None,
            off: std::env::var("SHOAL_LANE_SPIN").is_ok_and(|v| v == "0"),
        }
    }

    /// Polls around the due time (`true`) or sleeps until the input comes (`false`).
    pub fn set(&mut self, on: bool) {
        self.off = !on;
    }

    /// Waits until `input` has bytes or `watched` is readable, or until `deadline` (`None`: no end);
    /// with `learn`, how long the input took counts towards the usual wait.
    pub fn wait(
        &mut self,
        input: &TcpStream,
        watched: Option<&TcpStream>,
        deadline: Option<Instant>,
        learn: bool,
    ) -> std::io::Result<Ready> {
        let start = Instant::now();
        let ready = self.wait_from(start, input, watched, deadline)?;
        if learn && ready == Ready::Input {
            let took = start.elapsed();
            if took < LEARN_BELOW {
                self.usual = Some(match self.usual {
                    Some(u) => u.mul_f64(1.0 - SMOOTHING) + took.mul_f64(SMOOTHING),
                    None => took,
                });
            }
        }
        Ok(ready)
    }

    /// When to start polling without sleeping and for how long, from `start`: `None` before a wait was
    /// learnt.
    fn window(&self) -> Option<(Duration, Duration)> {
        let usual = self.usual.filter(|_| !self.off)?;
        let lead = usual.mul_f64(LEAD_SHARE).clamp(LEAD_MIN, LEAD_MAX);
        Some((usual.saturating_sub(lead), 2 * lead))
    }

    fn wait_from(
        &self,
        start: Instant,
        input: &TcpStream,
        watched: Option<&TcpStream>,
        deadline: Option<Instant>,
    ) -> std::io::Result<Ready> {
        let until = |t: Instant| deadline.map_or(t, |d| d.min(t));
        if let Some((sleep, window)) = self.window() {
            let wake = until(start + sleep);
            let ready = poll_until(input, watched, Some(wake))?;
            if ready != Ready::Neither {
                return Ok(ready);
            }
            let stop = until(wake + window);
            while Instant::now() < stop {
                let ready = poll_once(input, watched, Some(Duration::ZERO))?;
                if ready != Ready::Neither {
                    return Ok(ready);
                }
                std::hint::spin_loop();
            }
        }
        poll_until(input, watched, deadline)
    }
}

/// Sleeps in `poll` until one of the sockets is ready or `deadline` passes (`None`: no end).
fn poll_until(
    input: &TcpStream,
    watched: Option<&TcpStream>,
    deadline: Option<Instant>,
) -> std::io::Result<Ready> {
    loop {
        let timeout = match deadline {
            None => None,
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return Ok(Ready::Neither),
            },
        };
        match poll_once(input, watched, timeout) {
            Ok(Ready::Neither) if deadline.is_none() => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The poll flag for "the peer closed its side" where the OS has one (elsewhere a closed socket polls as
/// readable, which [`poll_once`] asks for too).
#[cfg(any(target_os = "linux", target_os = "android"))]
const PEER_CLOSED: libc::c_short = libc::POLLRDHUP;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const PEER_CLOSED: libc::c_short = 0;

/// One poll of `input` (for bytes) and `watched` (for its closing), waiting up to `timeout` (`None`:
/// no end, zero: not at all).
fn poll_once(
    input: &TcpStream,
    watched: Option<&TcpStream>,
    timeout: Option<Duration>,
) -> std::io::Result<Ready> {
    let mut fds = [
        libc::pollfd {
            fd: input.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: watched.map_or(-1, |w| w.as_raw_fd()),
            events: libc::POLLIN | PEER_CLOSED,
            revents: 0,
        },
    ];
    let n = sys_poll(&mut fds, timeout);
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(if fds[0].revents != 0 {
        Ready::Input
    } else if fds[1].revents != 0 {
        Ready::Watched
    } else {
        Ready::Neither
    })
}

/// `ppoll(2)`: the timeout to the nanosecond (the timer's slack aside). With `poll(2)`'s milliseconds, a
/// sleep until shortly before the input is due rounds up to the next millisecond — past the due time,
/// so the bytes would wake the thread after all.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn sys_poll(fds: &mut [libc::pollfd; 2], timeout: Option<Duration>) -> libc::c_int {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` is a valid array of two pollfd and `ts_ptr` null or a valid timespec for the
    // duration of the call (a negative fd is ignored); no signal mask is given.
    unsafe { libc::ppoll(fds.as_mut_ptr(), 2, ts_ptr, std::ptr::null()) }
}

/// `poll(2)` where there is no `ppoll`: the timeout rounded up to milliseconds (a deadline is never
/// reported early; the polling window may start late).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn sys_poll(fds: &mut [libc::pollfd; 2], timeout: Option<Duration>) -> libc::c_int {
    let ms = timeout.map_or(-1, |d| {
        d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
    });
    // SAFETY: `fds` is a valid array of two pollfd for the duration of the call (a negative fd is
    // ignored by poll).
    unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pair() -> (TcpStream, TcpStream) {
        super::super::lane::tcp_loopback_pair().unwrap()
    }

    #[test]
    fn a_wait_learns_the_usual_gap_and_polls_around_it() {
        let (mut tx, rx) = pair();
        let mut p = Pacer::default();
        assert_eq!(
            p.window(),
            None,
            "nothing learnt: sleep until the bytes come"
        );
        let sender = std::thread::spawn(move || {
            for _ in 0..4 {
                std::thread::sleep(Duration::from_millis(4));
                tx.write_all(b"x").unwrap();
            }
            tx
        });
        let mut buf = [0u8; 8];
        for _ in 0..4 {
            assert_eq!(p.wait(&rx, None, None, true).unwrap(), Ready::Input);
            use std::io::Read;
            assert_eq!((&rx).read(&mut buf).unwrap(), 1);
        }
        let usual = p.usual.expect("learnt");
        assert!(
            usual >= Duration::from_millis(1) && usual < LEARN_BELOW,
            "{usual:?}"
        );
        let (sleep, window) = p.window().unwrap();
        assert!(
            window >= 2 * LEAD_MIN && window <= 2 * LEAD_MAX,
            "{window:?}"
        );
        assert!(sleep < usual, "polling starts before the input is due");
        drop(sender.join().unwrap());
    }

    #[test]
    fn a_wait_ends_at_its_deadline_and_idle_waits_are_not_learnt() {
        let (_tx, rx) = pair();
        let mut p = Pacer {
            usual: Some(Duration::from_millis(1)),
            off: false,
        };
        let t = Instant::now();
        let ready = p
            .wait(&rx, None, Some(t + Duration::from_millis(5)), true)
            .unwrap();
        assert_eq!(ready, Ready::Neither);
        assert!(t.elapsed() >= Duration::from_millis(5));
        assert_eq!(
            p.usual,
            Some(Duration::from_millis(1)),
            "a timeout is no input"
        );
    }

    #[test]
    fn a_closed_watched_socket_ends_the_wait() {
        let (_tx, rx) = pair();
        let (out, out_peer) = pair();
        drop(out_peer);
        let mut p = Pacer::default();
        assert_eq!(p.wait(&rx, Some(&out), None, true).unwrap(), Ready::Watched);
    }
}
