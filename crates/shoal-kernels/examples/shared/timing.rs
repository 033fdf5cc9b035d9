//! Timing helpers shared by the kernel examples (included with `#[path]`; not an example itself).

use std::time::Instant;

/// On-CPU nanoseconds of the calling thread so far (Linux `schedstat`), if available: unlike
/// wall time it excludes time the thread was preempted by other processes.
pub fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Per-call timings in µs: best and median wall time over batches, and the best on-CPU time of
/// the calling thread (NaN where unavailable).
#[derive(Clone, Copy)]
pub struct Timing {
    pub best: f64,
    pub median: f64,
    pub cpu: f64,
}

/// Times `f` (which gets the call index) over `batches` batches of calls lasting ~`batch_s` each.
/// On a shared machine the best batch is the closest to the kernel's own speed, and the on-CPU
/// time of a single-threaded run is closer still; the median shows what neighbours cost.
pub fn time_us(batches: usize, batch_s: f64, mut f: impl FnMut(usize)) -> Timing {
    let mut i = 0;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < batch_s / 2.0 {
        f(i);
        i += 1;
    }
    let per_batch = (i * 2).max(3);
    let mut cpu = f64::INFINITY;
    let mut samples: Vec<f64> = (0..batches)
        .map(|_| {
            let (t, c) = (Instant::now(), thread_cpu_ns());
            for _ in 0..per_batch {
                f(i);
                i += 1;
            }
            if let (Some(c0), Some(c1)) = (c, thread_cpu_ns()) {
                cpu = cpu.min((c1 - c0) as f64 / 1e3 / per_batch as f64);
            }
            t.elapsed().as_secs_f64() * 1e6 / per_batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    Timing {
        best: samples[0],
        median: samples[samples.len() / 2],
        cpu: if cpu.is_finite() { cpu } else { f64::NAN },
    }
}
