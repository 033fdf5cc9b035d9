//! The dedicated thread pool: every part runs once, panics propagate, misuse cannot deadlock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shoal_kernels::{Parallel, ThreadPool};

#[test]
fn every_part_runs_exactly_once() {
    for (n, runs) in [(1, 100), (2, 5000), (3, 1000), (8, 200)] {
        let pool = ThreadPool::new(n);
        assert_eq!(pool.n_threads(), n);
        for _ in 0..runs {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(|t, nt| {
                assert_eq!(nt, n);
                hits[t].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}

#[test]
fn workers_wake_up_after_sleeping() {
    let pool = ThreadPool::with_spin(3, Duration::from_micros(10));
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(5));
        let count = AtomicUsize::new(0);
        pool.run(|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }
}

#[test]
fn caller_is_thread_zero_and_one_thread_has_no_workers() {
    let pool = ThreadPool::new(1);
    let me = std::thread::current().id();
    pool.run(|t, n| {
        assert_eq!((t, n), (0, 1));
        assert_eq!(std::thread::current().id(), me);
    });
    // Part 0 always runs on the caller; other parts run on a worker unless the caller got to
    // them first (part 0 sleeps so the worker has time to claim its part, even on a busy box).
    let pool = ThreadPool::new(2);
    let elsewhere = AtomicUsize::new(0);
    let start = std::time::Instant::now();
    while elsewhere.load(Ordering::Relaxed) == 0 && start.elapsed() < Duration::from_secs(5) {
        pool.run(|t, _| {
            let here = std::thread::current().id() == me;
            if t == 0 {
                assert!(here);
                std::thread::sleep(Duration::from_millis(1));
            } else if !here {
                elsewhere.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    assert!(
        elsewhere.load(Ordering::Relaxed) > 0,
        "the worker never ran a part"
    );
}

#[test]
fn worker_panics_reach_the_caller_and_the_pool_survives() {
    let pool = ThreadPool::new(3);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(|t, _| {
            if t == 2 {
                panic!("part two failed");
            }
        })
    }));
    let msg = r
        .expect_err("panic")
        .downcast::<&str>()
        .map(|s| *s)
        .unwrap_or("?");
    assert_eq!(msg, "part two failed");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(|t, _| assert_ne!(t, 0))
    }));
    assert!(r.is_err());
    let count = AtomicUsize::new(0);
    pool.run(|_, _| {
        count.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(count.load(Ordering::Relaxed), 3);
    // Still parallel afterwards (a panic must not leave the pool running everything serially).
    let me = std::thread::current().id();
    let elsewhere = AtomicUsize::new(0);
    let start = std::time::Instant::now();
    while elsewhere.load(Ordering::Relaxed) == 0 && start.elapsed() < Duration::from_secs(5) {
        pool.run(|t, _| {
            if t == 0 {
                std::thread::sleep(Duration::from_millis(1));
            } else if std::thread::current().id() != me {
                elsewhere.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    assert!(
        elsewhere.load(Ordering::Relaxed) > 0,
        "no part ran on a worker after a panic"
    );
}

#[test]
fn nested_and_concurrent_runs_complete() {
    let pool = Arc::new(ThreadPool::new(2));
    // Nested: the inner run finds the pool busy and runs every part on its own thread.
    let inner = Mutex::new(Vec::new());
    pool.run(|t, _| {
        pool.run(|u, n| inner.lock().expect("lock").push((t, u, n)));
    });
    let mut got = inner.into_inner().expect("lock");
    got.sort();
    assert_eq!(got, vec![(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]);
    // Concurrent callers from several threads.
    let total = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (pool, total) = (pool.clone(), total.clone());
            std::thread::spawn(move || {
                for _ in 0..500 {
                    pool.run(|_, _| {
                        total.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    assert_eq!(total.load(Ordering::Relaxed), 4 * 500 * 2);
}

#[test]
fn the_trait_object_runs_through_references_and_arcs() {
    let pool = Arc::new(ThreadPool::new(2));
    let count = AtomicUsize::new(0);
    let f = |_: usize, _: usize| {
        count.fetch_add(1, Ordering::Relaxed);
    };
    Parallel::run_parts(&pool, &f);
    Parallel::run_parts(&&*pool, &f);
    assert_eq!(Parallel::n_threads(&pool), 2);
    assert_eq!(count.load(Ordering::Relaxed), 4);
}

#[test]
fn dropping_an_idle_pool_joins_its_workers() {
    for spin in [Duration::ZERO, Duration::from_millis(1)] {
        let pool = ThreadPool::with_spin(4, spin);
        pool.run(|_, _| {});
        std::thread::sleep(Duration::from_millis(3));
        drop(pool);
    }
    // Dropped before any job was published.
    drop(ThreadPool::new(3));
}
