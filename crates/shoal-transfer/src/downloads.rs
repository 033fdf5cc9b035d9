//! The node's downloads: one [`Downloads`] handle (cheap to clone) brings the models this node lacks and
//! publishes every download's progress in the node's facts, so `GET /downloads` on any node shows them.
//!
//! [`Downloads::fetch`] brings a model — or only the bytes one stage reads — to this node:
//! 1. **Peers first.** Every member whose facts list the model is asked for its [`Manifest`]; the one
//!    most peers agree on (by [`Manifest::root`]; for a catalog model, one whose whole-file sha256 is the
//!    catalog's) is used, and all peers that sent it serve chunks at once. For a hub model the hub's
//!    resolve URL is one more ranged source (verified against the same manifest), unless offline.
//! 2. **A stage takes only its bytes** ([`fetch_stage`]): the GGUF header first, then only the chunks
//!    holding the stage's tensors; the stage loads from the sparse `.partial` file, which never counts
//!    as a complete model.
//! 3. **Else the internet.** When no peer has the model, or the peers' sources all failed, the store
//!    pulls the whole file (hub or pip) with its own resume and checks.
//!
//! One fetch per model at a time (a second waits for the first, then finds most chunks verified). A
//! cancelled or failed download keeps what was verified for the next run.

use shoal_ids::ModelId;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libp2p::PeerId;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use shoal_cluster::facts::DownloadFacts;
use shoal_cluster::{ClusterHandle, Snapshot};
use shoal_store::{ModelRef, PullOptions, Store};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::TransferError;
use crate::fetch::{FetchProgress, FetchSpec, FetchState, Wanted, fetch};
use crate::manifest::Manifest;
use crate::peer::PeerSource;
use crate::source::{ChunkSource, HttpSource};
use crate::stage::{StageLayers, fetch_stage};

/// Finished downloads kept in the published list.
const KEEP_FINISHED: usize = 8;
/// How long a peer may take to send its manifest (it may hash the file first).
const MANIFEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the peers' fetch waits for the hub to say where a hub model's file is.
const HUB_WAIT: Duration = Duration::from_secs(5);
/// Parallel streams per peer source.
const STREAMS_PER_PEER: usize = 2;
/// How often running downloads are published.
const PUBLISH_EVERY: Duration = Duration::from_millis(500);

/// What to bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Whole,
    /// The bytes layers `start..end` of `n_layers` read.
    Stage {
        start: usize,
        end: usize,
        n_layers: usize,
    },
}

/// Called with the model id and its file when a whole model has arrived.
pub type OnComplete = Arc<dyn Fn(&str, &Path) + Send + Sync>;

/// The node's downloads (see the module doc).
#[derive(Clone)]
pub struct Downloads {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    cluster: ClusterHandle,
    client: reqwest::Client,
    /// One lock per model: one fetch per model at a time.
    locks: Mutex<HashMap<ModelId, Arc<tokio::sync::Mutex<()>>>>,
    running: Mutex<BTreeMap<ModelId, Running>>,
    finished: Mutex<VecDeque<DownloadFacts>>,
    on_complete: Mutex<Option<OnComplete>>,
}

struct Running {
    progress: watch::Receiver<FetchProgress>,
    cancel: CancellationToken,
}

impl Downloads {
    /// The downloads of the node `cluster` into `store`; starts the task publishing their progress.
    pub fn new(store: Store, cluster: ClusterHandle) -> Self {
        let inner = Arc::new(Inner {
            store,
            cluster,
            client: reqwest::Client::new(),
            locks: Mutex::default(),
            running: Mutex::default(),
            finished: Mutex::default(),
            on_complete: Mutex::default(),
        });
        tokio::spawn(publish(Arc::downgrade(&inner)));
        Self { inner }
    }

    /// The store models are brought into.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Sets what runs when a whole model has arrived (the node offers it to the cluster).
    pub fn on_complete(&self, f: OnComplete) {
        *lock(&self.inner.on_complete) = Some(f);
    }

    /// Starts bringing the whole of `model` in the background (`GET /downloads` shows it). `model` is a
    /// model id ([`Store::model_dir`]): a path, `..`, an empty or over-long name, a folder that is a
    /// symbolic link is refused here and never becomes a download.
    pub fn start(&self, model: &str) -> Result<(), TransferError> {
        check_id(&self.inner.store, model)?;
        let this = self.clone();
        let model = model.to_string();
        tokio::spawn(async move {
            if let Err(e) = this.fetch(&model, Want::Whole).await {
                tracing::warn!(model = %model, "download failed: {e}");
            }
        });
        Ok(())
    }

    /// Cancels the running download of `model`; false when there is none.
    pub fn cancel(&self, model: &str) -> bool {
        match lock(&self.inner.running).get(model) {
            Some(r) => {
                r.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// The progress of the running download of `model`, if any.
    pub fn progress(&self, model: &str) -> Option<FetchProgress> {
        lock(&self.inner.running)
            .get(model)
            .map(|r| r.progress.borrow().clone())
    }

    /// The downloads running here and the last finished ones.
    pub fn list(&self) -> Vec<DownloadFacts> {
        self.inner.list()
    }

    /// Brings `model` (or the part of it `want` says) here; the file to load from.
    pub async fn fetch(&self, model: &str, want: Want) -> Result<PathBuf, TransferError> {
        let id = check_id(&self.inner.store, model)?;
        if let Ok(path) = self.inner.store.model_file(model) {
            return Ok(path);
        }
        let model_lock = lock(&self.inner.locks)
            .entry(id.clone())
            .or_default()
            .clone();
        let _one_at_a_time = model_lock.lock().await;
        if let Ok(path) = self.inner.store.model_file(model) {
            return Ok(path);
        }
        let (tx, rx) = watch::channel(FetchProgress::default());
        let cancel = CancellationToken::new();
        lock(&self.inner.running).insert(
            id.clone(),
            Running {
                progress: rx.clone(),
                cancel: cancel.clone(),
            },
        );
        let result = self.inner.bring(model, want, &tx, &cancel).await;
        lock(&self.inner.running).remove(model);
        let mut facts = facts_of(&id, &rx.borrow());
        match &result {
            Ok(_) => facts.state = "done".into(),
            Err(TransferError::Cancelled) => facts.state = "cancelled".into(),
            Err(e) => {
                facts.state = "failed".into();
                facts.error = Some(e.to_string());
            }
        }
        let mut finished = lock(&self.inner.finished);
        finished.retain(|f| f.model != model);
        finished.push_back(facts);
        while finished.len() > KEEP_FINISHED {
            finished.pop_front();
        }
        drop(finished);
        if let Ok(path) = &result
            && want == Want::Whole
            && let Some(f) = lock(&self.inner.on_complete).clone()
        {
            f(model, path);
        }
        result
    }
}

impl Inner {
    fn list(&self) -> Vec<DownloadFacts> {
        let mut out: Vec<DownloadFacts> = lock(&self.finished).iter().cloned().collect();
        for (model, r) in lock(&self.running).iter() {
            out.retain(|f| &f.model != model);
            let mut f = facts_of(model, &r.progress.borrow());
            f.state = "running".into();
            out.push(f);
        }
        out
    }

    /// Peers first, then the internet (see the module doc).
    async fn bring(
        &self,
        model: &str,
        want: Want,
        progress: &watch::Sender<FetchProgress>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, TransferError> {
        let peer_error = match self.peers_route(model, want, progress, cancel).await {
            Ok(Some(path)) => return Ok(path),
            Ok(None) => None,
            Err(TransferError::Cancelled) => return Err(TransferError::Cancelled),
            Err(e) => {
                tracing::warn!(
                    model,
                    "fetching from peers failed, trying the internet: {e}"
                );
                Some(e)
            }
        };
        self.internet_route(model, progress, cancel)
            .await
            .map_err(|e| match peer_error {
                Some(p) => TransferError::Store(format!("{e} (after the peers failed: {p})")),
                None => e,
            })
    }

    /// `None` when no peer has the model.
    async fn peers_route(
        &self,
        model: &str,
        want: Want,
        progress: &watch::Sender<FetchProgress>,
        cancel: &CancellationToken,
    ) -> Result<Option<PathBuf>, TransferError> {
        let holders = self.holders(model);
        if holders.is_empty() {
            return Ok(None);
        }
        let Some((manifest, peers)) = self.agreed_manifest(model, &holders).await? else {
            return Ok(None);
        };
        let manifest = Arc::new(manifest);
        let mut sources: Vec<Arc<dyn ChunkSource>> = peers
            .into_iter()
            .map(|p| {
                Arc::new(PeerSource::new(
                    self.cluster.streams(),
                    p,
                    model,
                    STREAMS_PER_PEER,
                )) as Arc<dyn ChunkSource>
            })
            .collect();
        // The hub is one more source when it answers quickly; the peers do not wait on it.
        if let Ok(Some(hub)) = tokio::time::timeout(HUB_WAIT, self.hub_source(model)).await {
            sources.push(hub);
        }
        // The folder lists under the model's id (and as partial until the file is whole).
        let dir = self
            .store
            .record_arriving(
                model,
                &manifest.file_name,
                manifest.size,
                manifest.sha256.clone(),
            )
            .map_err(|e| TransferError::Store(e.to_string()))?;
        let dest = dir.join(&manifest.file_name);
        if want == Want::Whole {
            shoal_store::ensure_space(&dir, manifest.size, 0)
                .map_err(|e| TransferError::Store(e.to_string()))?;
        }
        let outcome = match want {
            Want::Whole => {
                fetch(
                    FetchSpec::new(manifest, dest, Wanted::Whole),
                    sources,
                    progress,
                    cancel,
                )
                .await?
            }
            Want::Stage { start, end, .. } => {
                let layers = StageLayers { start, end };
                fetch_stage(manifest, dest, layers, sources, progress, cancel).await?
            }
        };
        Ok(Some(outcome.path))
    }

    /// Members other than this node whose facts list `model`.
    fn holders(&self, model: &str) -> Vec<PeerId> {
        holders(
            &self.cluster.snapshot(),
            &self.cluster.id().to_string(),
            model,
        )
    }

    /// The manifest most holders agree on, with those holders; `None` when none answered.
    async fn agreed_manifest(
        &self,
        model: &str,
        holders: &[PeerId],
    ) -> Result<Option<(Manifest, Vec<PeerId>)>, TransferError> {
        let expected_sha = match ModelRef::parse_id(model) {
            Ok(ModelRef::Catalog(e)) => Some(e.sha256.to_string()),
            _ => None,
        };
        let asks = holders.iter().map(|&p| {
            let source = PeerSource::new(self.cluster.streams(), p, model, 1);
            async move {
                let m = tokio::time::timeout(MANIFEST_TIMEOUT, source.manifest()).await;
                (p, m)
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut groups: BTreeMap<String, (Manifest, Vec<PeerId>)> = BTreeMap::new();
        for (peer, answer) in answers {
            match answer {
                Ok(Ok(m)) => {
                    if let (Some(want), Some(got)) = (&expected_sha, &m.sha256)
                        && want != got
                    {
                        tracing::warn!(%peer, model, "peer's copy is not the catalog's file: not used");
                        continue;
                    }
                    groups
                        .entry(m.root())
                        .or_insert_with(|| (m, Vec::new()))
                        .1
                        .push(peer);
                }
                Ok(Err(e)) => tracing::warn!(%peer, model, "no manifest: {e}"),
                Err(_) => tracing::warn!(%peer, model, "no manifest in time"),
            }
        }
        Ok(groups.into_values().max_by_key(|(_, peers)| peers.len()))
    }

    /// The hub's resolve URL of a hub model as one more ranged source (none offline or for other models).
    async fn hub_source(&self, model: &str) -> Option<Arc<dyn ChunkSource>> {
        let Ok(ModelRef::Hub(r)) = ModelRef::parse_id(model) else {
            return None;
        };
        if self.store.hub_config().offline {
            return None;
        }
        let hub = self.store.hub().ok()?;
        let file = match hub.resolve(&r).await {
            Ok(f) => f,
            Err(e) => {
                tracing::info!(model, "the hub is not a source: {e}");
                return None;
            }
        };
        let (url, headers) = hub.resolve_url(&file);
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                map.insert(k, v);
            }
        }
        Some(Arc::new(HttpSource::new(self.client.clone(), url, map)))
    }

    /// The whole file from the hub or pip, with the store's progress mirrored into `progress`.
    async fn internet_route(
        &self,
        model: &str,
        progress: &watch::Sender<FetchProgress>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, TransferError> {
        let r = ModelRef::parse_id(model).map_err(|e| {
            TransferError::Store(format!(
                "no peer has '{model}', and it is not a hub or catalog model to download: {e}"
            ))
        })?;
        let tx = progress.clone();
        let token = shoal_store::CancelToken::new();
        let opts = PullOptions {
            progress: Arc::new(move |p: &shoal_store::Progress| {
                tx.send_modify(|f| {
                    f.state = FetchState::Fetching;
                    f.file_size = p.total;
                    f.needed = p.total;
                    f.done = p.done;
                    f.bytes_per_s = p.bytes_per_s;
                    f.eta_s = p.eta_s;
                    match f.sources.iter_mut().find(|s| s.name == "internet") {
                        Some(s) => s.bytes = p.done.saturating_sub(p.resumed_from),
                        None => f.sources.push(crate::fetch::SourceProgress {
                            name: "internet".into(),
                            bytes: p.done.saturating_sub(p.resumed_from),
                            ..Default::default()
                        }),
                    }
                });
            }),
            cancel: token.clone(),
            offline: false,
        };
        let watcher = {
            let (cancel, token) = (cancel.clone(), token.clone());
            tokio::spawn(async move {
                cancel.cancelled().await;
                token.cancel();
            })
        };
        let pulled = self.store.pull(&r, &opts).await;
        watcher.abort();
        match pulled {
            Ok(p) => Ok(p.path),
            Err(_) if cancel.is_cancelled() => Err(TransferError::Cancelled),
            Err(e) => Err(TransferError::Store(e.to_string())),
        }
    }
}

/// The members of `snap` other than `me` whose facts list `model` (complete there: a source).
pub fn holders(snap: &Snapshot, me: &str, model: &str) -> Vec<PeerId> {
    snap.state
        .members()
        .into_iter()
        .filter(|id| *id != me)
        .filter(|id| {
            snap.state
                .facts_of(id)
                .is_some_and(|f| f.models.iter().any(|m| m.id == model))
        })
        .filter_map(|id| id.parse().ok())
        .collect()
}

/// A model id this node can keep in its models dir ([`Store::model_dir`]: a checked id whose folder, if
/// there, is no symbolic link): never a path. Names reaching the store from here (a client's, a peer's)
/// are parsed with [`ModelRef::parse_id`], which never yields a path nor looks at the disk.
fn check_id(store: &Store, model: &str) -> Result<ModelId, TransferError> {
    store
        .model_dir(model)
        .map_err(|e| TransferError::Store(e.to_string()))?;
    ModelId::parse(model).map_err(|e| TransferError::Store(e.to_string()))
}

/// The published form of one download's progress.
fn facts_of(model: &ModelId, p: &FetchProgress) -> DownloadFacts {
    DownloadFacts {
        model: model.clone(),
        state: String::new(),
        needed: p.needed,
        done: p.done,
        file_size: p.file_size,
        bytes_per_s: p.bytes_per_s,
        eta_s: p.eta_s,
        sources: p
            .sources
            .iter()
            .map(|s| (s.name.clone(), s.bytes))
            .collect(),
        refused_chunks: p.chunks_refused,
        error: None,
    }
}

/// Publishes the list in the node's facts whenever it changes (checked every [`PUBLISH_EVERY`]), until
/// the downloads are dropped.
async fn publish(inner: std::sync::Weak<Inner>) {
    let mut last: Option<Vec<DownloadFacts>> = None;
    loop {
        tokio::time::sleep(PUBLISH_EVERY).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = inner.list();
        if last.as_ref() != Some(&now) {
            inner.cluster.set_downloads(now.clone()).await;
            last = Some(now);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
