//! shoal-testkit: what the tests of every shoal crate share (a dev-dependency only, never linked into
//! the binary).
//!
//! - [`rng`]: [`SplitMix64`](rng::SplitMix64), the project's one seeded generator (it lives in
//!   `shoal-kernels`, where the engine's sampler uses it), and [`Draw`](rng::Draw), the draws tests
//!   make with it (counts in a range, coin flips, bytes, floats in an interval).
//! - [`fixtures`]: where the real test model (`SHOAL_TEST_MODEL`) and the llama.cpp golden files
//!   (`SHOAL_GOLDEN_DIR`) are; a missing file fails the test with instructions, never skips it; llama.cpp's
//!   embedding vectors ([`fixtures::embedding_reference`]) and [`fixtures::cosine`].
//! - [`process`]: tests that run a real binary — a child killed when the test ends
//!   ([`KillOnDrop`](process::KillOnDrop)) and waiting, with a deadline, for the line it prints when
//!   ready ([`line_starting_with`](process::line_starting_with)).
//! - [`tree`]: [`snapshot`](tree::snapshot) of what a folder holds (bytes and times), to prove a
//!   command left that part of the disk alone.
//!
//! It depends on `shoal-kernels` and `serde_json` only, so the tests of any crate (kernels' own
//! included) can use it without a dependency circle.

pub mod fixtures;
pub mod process;
pub mod rng;
pub mod tree;
