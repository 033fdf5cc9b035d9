//! shoal-api's integration tests, one test binary: each file directly under `tests/` would be a binary of
//! its own (~70 MB each, the whole dependency tree statically linked), so the test files are modules here
//! and `common` (the shared engine on the real model and the request helpers) is their sibling.

mod common;

mod anthropic;
mod auth;
mod cancel;
mod choices;
mod cut_calls;
mod disconnect;
mod embeddings;
mod errors;
mod front;
mod generation;
mod harmony;
mod hostile_names;
mod limits;
mod metrics;
mod ollama;
mod ollama_models;
mod ollama_tools;
mod origins;
mod progress;
mod reasoning;
mod tools;
