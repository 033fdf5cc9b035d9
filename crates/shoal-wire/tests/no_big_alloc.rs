//! Lying lengths and counts must be rejected before allocating: a counting global allocator
//! records the largest single request while hostile inputs are decoded. (Own test binary, so
//! the allocator sees only this file's single test.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use shoal_wire::{DEFAULT_MAX_FRAME_LEN, Frame, FrameReader, WireError, kind};

struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

#[test]
fn hostile_lengths_and_counts_do_not_allocate() {
    let mut inputs: Vec<Vec<u8>> = vec![
        u32::MAX.to_le_bytes().to_vec(),
        (DEFAULT_MAX_FRAME_LEN + 1).to_le_bytes().to_vec(),
        // Max-size frame announced, 5 bytes delivered: must wait, not reserve 64 MiB.
        [
            &DEFAULT_MAX_FRAME_LEN.to_le_bytes()[..],
            &[kind::RELEASE, 0],
        ]
        .concat(),
    ];
    for (k, payload) in [
        (kind::RELEASE, u32::MAX.to_le_bytes().to_vec()),
        (
            kind::TOKENS,
            [&[0u8; 8][..], &u32::MAX.to_le_bytes()].concat(),
        ),
        (
            kind::ACTIVATIONS,
            [&[0u8; 8][..], &u32::MAX.to_le_bytes()].concat(),
        ),
        (
            kind::POOLED,
            [
                &[0u8; 8][..],
                &u32::MAX.to_le_bytes(),
                &u32::MAX.to_le_bytes(),
            ]
            .concat(),
        ),
        (
            kind::SAMPLE,
            [&[0u8; 8][..], &u32::MAX.to_le_bytes()].concat(),
        ),
    ] {
        let mut v = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
        v.push(k);
        v.extend(payload);
        inputs.push(v);
    }
    LARGEST.store(0, Ordering::Relaxed);
    for input in &inputs {
        let mut r = FrameReader::default();
        r.push(input);
        match r.next_frame() {
            Ok(None) => {}
            Err(
                WireError::FrameTooLarge { .. }
                | WireError::Truncated { .. }
                | WireError::EmptyFrame,
            ) => {}
            other => panic!("unexpected {other:?}"),
        }
        let _ = Frame::decode(input, DEFAULT_MAX_FRAME_LEN);
    }
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest < 4096, "largest allocation {largest} bytes");
}
