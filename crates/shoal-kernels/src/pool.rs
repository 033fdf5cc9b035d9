//! Thread pools for the kernels: a dedicated spin-then-sleep pool and a rayon adapter.
//!
//! A decode step runs ~200 matmuls of tens of microseconds each, so the cost of handing work to
//! other threads must be far below a microsecond. [`ThreadPool`] works like llama.cpp's: the
//! calling thread is thread 0 and does its share; `n - 1` workers wait for a new job by spinning
//! on a generation counter for a short while (`spin`, default 200 µs — longer than the gaps
//! between the matmuls of one step) and then sleep on a condition variable, so an idle server uses
//! no CPU. With one thread there are no workers and [`ThreadPool::run`] is a plain call.
//! Parts are claimed, not assigned: once the caller has finished part 0 it takes every part no
//! worker has started, so a worker descheduled by another process (common on a 2-core machine)
//! never stalls a job; the matmul's parts pull row chunks from a shared counter, so whoever runs
//! computes the same outputs.
//!
//! How the engine should use it: create one pool per stage with as many threads as physical cores
//! it may use (including the engine's own thread), share it (`Arc<ThreadPool>`) among the layers,
//! and call the kernels from one engine thread. Concurrent or nested calls are still correct: a
//! `run` that finds the pool busy executes every part on the calling thread.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Something that runs a job on several threads: `run_parts(f)` calls `f(t, n)` exactly once for each
/// `t` in `0..n` (possibly all on the calling thread) and returns when all calls have returned.
pub trait Parallel: Sync {
    /// Number of parts `run` splits a job into.
    fn n_threads(&self) -> usize;
    /// Runs `f(t, n)` for every `t` in `0..n`, `n = self.n_threads()`.
    fn run_parts(&self, f: &(dyn Fn(usize, usize) + Sync));
}

impl<T: Parallel + ?Sized> Parallel for &T {
    fn n_threads(&self) -> usize {
        (**self).n_threads()
    }
    fn run_parts(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        (**self).run_parts(f)
    }
}

impl<T: Parallel + ?Sized + Send> Parallel for Arc<T> {
    fn n_threads(&self) -> usize {
        (**self).n_threads()
    }
    fn run_parts(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        (**self).run_parts(f)
    }
}

/// Runs jobs on the rayon pool of the calling thread (or the global one): `n_threads` is
/// `rayon::current_num_threads()`. Cheap only when called from inside that pool
/// (`rayon::ThreadPool::install`); from other threads each call pays rayon's injection wake-up.
#[derive(Debug, Clone, Copy, Default)]
pub struct RayonCurrent;

impl Parallel for RayonCurrent {
    fn n_threads(&self) -> usize {
        rayon::current_num_threads()
    }
    fn run_parts(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = rayon::current_num_threads();
        if n <= 1 {
            return f(0, 1);
        }
        rayon::broadcast(|ctx| f(ctx.index(), n));
    }
}

type Job = *const (dyn Fn(usize, usize) + Sync + 'static);

/// A per-part claim word on its own cache line: the generation that last claimed the part.
#[repr(align(64))]
struct Claim(AtomicUsize);

struct Shared {
    /// Bumped once per job (and once at shutdown); workers wait for it to change.
    generation: AtomicUsize,
    /// The current job; written only by the caller holding `busy`, while no worker can read it.
    job: UnsafeCell<Option<Job>>,
    /// `claims[t]`: the last generation whose part `t` someone took (worker `t` or the caller).
    claims: Vec<Claim>,
    /// Workers between noticing a job and finishing with it.
    active: AtomicUsize,
    /// Payload of the first worker panic of the current job.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    shutdown: AtomicBool,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    n_threads: usize,
    spin: Duration,
}

impl Shared {
    /// Takes part `t` of generation `g`; false if someone already did.
    fn claim(&self, t: usize, g: usize) -> bool {
        self.claims[t].0.fetch_max(g, Ordering::SeqCst) < g
    }
}

// SAFETY: `job` is written only by the caller holding `ThreadPool::busy`, before it publishes a
// generation (SeqCst increment, which workers Acquire) and after `active` drops to 0 with every
// part claimed; a worker reads it only after claiming a part of the current generation, which
// keeps the caller waiting (see `run_dyn`). The pointee is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads for the kernels; see the module docs.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    busy: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.shared.n_threads)
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all (the caller plus `n_threads - 1` workers; 0 counts
    /// as 1), spinning for 200 µs before sleeping.
    pub fn new(n_threads: usize) -> Self {
        Self::with_spin(n_threads, Duration::from_micros(200))
    }

    /// A pool whose idle workers spin for `spin` before sleeping.
    ///
    /// # Panics
    /// If the operating system refuses to start a thread.
    pub fn with_spin(n_threads: usize, spin: Duration) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            claims: (0..n_threads).map(|_| Claim(AtomicUsize::new(0))).collect(),
            active: AtomicUsize::new(0),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            n_threads,
            spin,
        });
        let workers = (1..n_threads)
            .map(|t| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("shoal-kernel-{t}"))
                    .spawn(move || worker(&s, t))
                    .unwrap_or_else(|e| {
                        panic!("shoal_kernels::ThreadPool: cannot start a worker thread: {e}")
                    })
            })
            .collect();
        Self {
            shared,
            workers,
            busy: Mutex::new(()),
        }
    }

    /// Threads taking part in each job, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(t, n)` for `t` in `0..n` and waits for all of them. The caller runs part 0, then
    /// every part whose worker has not started it yet (a descheduled worker never stalls a job);
    /// jobs that pull work from a shared counter thus lose nothing when a worker is late.
    /// A panic in any part is re-raised here after every part has finished.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        self.run_dyn(&f)
    }

    fn run_dyn(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let s = &*self.shared;
        let n = s.n_threads;
        if n == 1 {
            return f(0, 1);
        }
        // Busy (another thread's job, or a nested call from inside a job): run it all here.
        // (`busy` is never poisoned: it is released before a panic is re-raised below.)
        let busy = match self.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return (0..n).for_each(|t| f(t, n)),
        };
        // SAFETY: only the lifetime is erased; the pointer is cleared below, and no worker can
        // dereference it after every part is claimed and `active` is 0, which we wait for.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f) };
        // SAFETY: we hold `busy` and the previous job is finished: no worker reads `job` now.
        unsafe { *s.job.get() = Some(job) };
        let g = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mut mine = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        for t in 1..n {
            if s.claim(t, g) {
                let r = catch_unwind(AssertUnwindSafe(|| f(t, n)));
                if mine.is_ok() {
                    mine = r;
                }
            }
        }
        wait_for_workers(s);
        // SAFETY: every part is claimed and no worker is active: nobody reads `job`.
        unsafe { *s.job.get() = None };
        let theirs = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(busy);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = theirs {
            resume_unwind(p);
        }
    }
}

impl Parallel for ThreadPool {
    fn n_threads(&self) -> usize {
        self.shared.n_threads
    }
    fn run_parts(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        self.run_dyn(f)
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Spins (then yields, for oversubscribed machines) until no worker is active.
fn wait_for_workers(s: &Shared) {
    let mut spins = 0u32;
    while s.active.load(Ordering::SeqCst) != 0 {
        if spins < 2048 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn worker(s: &Shared, t: usize) {
    // Start from the initial generation, not a fresh load: a job may already be published before
    // this thread first runs, and it must not be skipped.
    let mut seen = 0;
    loop {
        seen = wait_for_generation(s, seen);
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Become active before claiming, so a caller that sees our claim also sees us active.
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.claim(t, seen) {
            // SAFETY: we claimed part `t` of generation `seen`, so the caller is still inside that
            // job (it waits for `active` to reach 0) and `job` holds its closure, published
            // before the generation we Acquired.
            if let Some(job) = unsafe { *s.job.get() } {
                // SAFETY: as above, the closure outlives our use.
                let f = unsafe { &*job };
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(t, s.n_threads))) {
                    let mut slot = s.panic.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(p);
                }
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits until `generation != seen`: spins for `s.spin`, then sleeps. Returns the new value.
fn wait_for_generation(s: &Shared, seen: usize) -> usize {
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        let g = s.generation.load(Ordering::Acquire);
        if g != seen {
            return g;
        }
        std::hint::spin_loop();
        i = i.wrapping_add(1);
        if i.is_multiple_of(256) && start.elapsed() >= s.spin {
            break;
        }
    }
    let mut guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    let g = loop {
        let g = s.generation.load(Ordering::SeqCst);
        if g != seen {
            break g;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    };
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
    g
}
