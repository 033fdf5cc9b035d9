//! `POST /api/pull`: brings a model to this node through its [`Downloads`] (peers that have it first,
//! else the hub or the catalog), with Ollama's progress lines.
//!
//! The name is checked before anything is sent: a catalog id, or a hub reference the hub resolves to a
//! file (its LFS sha256 and size become the `digest` and `total` of the progress lines), or a model a
//! member of the cluster has; anything else is a 404 (a path or a bad name a 400, decided from the text
//! alone: [`ModelRef::parse_id`] never looks at the disk, so a path answers the same whether or not the
//! file exists). Then the download runs as its own task — it finishes even if the client goes away,
//! `GET /downloads` shows it, and a second pull of the same model waits for it — while the answer
//! reports it:
//!
//! `{"status":"pulling manifest"}`, then `{"status":"downloading <digest>","digest","total","completed"}`
//! as bytes arrive (bytes a previous run left count as completed), `{"status":"verifying sha256
//! digest"}` (the store and the transfer check every byte before the file counts as complete),
//! `{"status":"success"}` once the node offers the model (it can be used at once); a failure midway is an `{"error": …}` line. With `stream: false` only the last
//! object is sent (or the error with its status).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use shoal_store::{ModelRef, StoreError};
use shoal_transfer::{Downloads, TransferError, Want};
use tokio::task::JoinHandle;

use super::Error;
use super::stream::{json_response, ndjson_response, to_json};
use super::types::{Progress, PullRequest};
use crate::ApiState;
use crate::error::ApiError;

/// How often a running download's progress is looked at.
const POLL: Duration = Duration::from_millis(250);

/// How long a pulled model may take to be offered to the cluster before "success" is sent anyway.
const OFFER_WAIT: Duration = Duration::from_secs(10);

/// What the check before the download learnt.
struct Plan {
    /// The model's id in the store.
    id: String,
    /// `sha256:<hex>` when known (the catalog's or the hub's), else the id.
    digest: String,
    /// Complete here already.
    present: bool,
}

#[utoipa::path(
    post,
    path = "/api/pull",
    operation_id = "post_api_pull",
    tag = "ollama",
    request_body = super::types::PullRequest,
    responses(
        (status = 200, description = "Progress; streamed (the default) as one object per line, ending with `{\"status\": \"success\"}`.", content((super::types::Progress = "application/json"), (super::types::PullLine = "application/x-ndjson"))),
        crate::schema::OllamaErrors
    )
)]
pub async fn pull(
    State(state): State<ApiState>,
    body: Result<Json<PullRequest>, JsonRejection>,
) -> Result<Response, Error> {
    let Json(req) = body?;
    let name = req.model()?;
    if req.insecure == Some(true) {
        return Err(ApiError::invalid(
            "insecure",
            "insecure: shoal always checks TLS certificates (point HF_ENDPOINT at a plain http:// hub instead)",
        )
        .into());
    }
    let downloads = state.downloads.clone().ok_or_else(|| {
        Error(ApiError::NotFound(
            "this node has no model store to pull into".into(),
        ))
    })?;
    let plan = plan(&state, &downloads, &name).await?;
    let task = {
        let (downloads, id) = (downloads.clone(), plan.id.clone());
        // A model that arrives is offered to the cluster; one already here was offered at start.
        let cluster = state.cluster.clone().filter(|_| !plan.present);
        tokio::spawn(async move {
            let path = downloads.fetch(&id, Want::Whole).await?;
            if let Some(cluster) = cluster {
                // The node offers a model once it has arrived; "success" means it can be used.
                let me = cluster.id().to_string();
                let offered = |s: &shoal_cluster::Snapshot| {
                    s.state
                        .facts_of(&me)
                        .is_some_and(|f| f.models.iter().any(|m| m.id == id))
                };
                cluster.wait_for(OFFER_WAIT, offered).await;
            }
            Ok(path)
        })
    };
    tracing::info!(model = %plan.id, "pulling through /api/pull");
    if req.stream.unwrap_or(true) {
        return Ok(ndjson_response(lines(downloads, plan, task)));
    }
    Ok(match task.await {
        Ok(Ok(_)) => json_response(to_json(&Progress::status("success"))),
        Ok(Err(e)) => failed(&e),
        Err(e) => {
            Error(ApiError::Internal(format!("the download task failed: {e}"))).into_response()
        }
    })
}

/// A download that failed after it started: not the request's fault, so 502 with what went wrong.
fn failed(e: &TransferError) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(json!({ "error": e.to_string() })),
    )
        .into_response()
}

/// Checks the name and where the model would come from (see the module doc).
async fn plan(state: &ApiState, downloads: &Downloads, name: &str) -> Result<Plan, Error> {
    let name = name.trim();
    let name = name.strip_suffix(":latest").unwrap_or(name);
    let not_found = |why: &dyn std::fmt::Display| {
        Error(ApiError::NotFound(format!(
            "pull model manifest: model \"{name}\" not found: {why}"
        )))
    };
    // A name from the network: a catalog id or a hub reference, never a path, and nothing on the disk is
    // looked at to decide — an existing and a missing file get the same 400.
    let r = match ModelRef::parse_id(name) {
        Ok(r) => r,
        Err(e @ StoreError::UnknownModel(_)) => return Err(not_found(&e)),
        Err(e) => {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "{e}; a file is served with `shoal serve --model PATH` or copied into the models directory"
                ),
            )
            .into());
        }
    };
    let id = r.id();
    shoal_store::check_model_id(&id).map_err(|e| ApiError::invalid("model", e.to_string()))?;
    let unknown_digest = Plan {
        id: id.clone(),
        digest: id.clone(),
        present: false,
    };
    let store = downloads.store();
    if store.model_file(&id).is_ok() {
        let digest = match &r {
            ModelRef::Catalog(e) => format!("sha256:{}", e.sha256),
            _ => id.clone(),
        };
        return Ok(Plan {
            id,
            digest,
            present: true,
        });
    }
    if let ModelRef::Catalog(e) = &r {
        return Ok(Plan {
            id,
            digest: format!("sha256:{}", e.sha256),
            present: false,
        });
    }
    if let Some(cluster) = &state.cluster {
        let snap = cluster.snapshot();
        let me = cluster.id().to_string();
        if !shoal_transfer::downloads::holders(&snap, &me, &id).is_empty() {
            return Ok(unknown_digest);
        }
    }
    let ModelRef::Hub(hub_ref) = r else {
        return Ok(unknown_digest);
    };
    let hub = store
        .hub()
        .map_err(|e| Error(ApiError::Internal(e.to_string())))?;
    match hub.resolve(&hub_ref).await {
        Ok(file) => Ok(Plan {
            digest: file
                .sha256()
                .map_or_else(|| id.clone(), |s| format!("sha256:{s}")),
            id,
            present: false,
        }),
        Err(
            e @ (StoreError::HubNotFound { .. }
            | StoreError::NoMatchingGguf { .. }
            | StoreError::FileNotInRepo { .. }
            | StoreError::Offline { .. }),
        ) => Err(not_found(&e)),
        Err(e @ (StoreError::AmbiguousGguf { .. } | StoreError::SplitGguf(_))) => {
            Err(ApiError::invalid("model", e.to_string()).into())
        }
        Err(e @ StoreError::Unauthorized { .. }) => {
            Err(ApiError::invalid("model", e.to_string()).into())
        }
        Err(e) => {
            tracing::warn!(model = %id, "the hub did not answer: {e}");
            Err(ApiError::Unavailable.into())
        }
    }
}

struct Lines {
    downloads: Downloads,
    plan: Plan,
    task: JoinHandle<Result<std::path::PathBuf, TransferError>>,
    /// Lines ready to send.
    queue: std::collections::VecDeque<String>,
    /// The last (completed, total) reported.
    reported: Option<(u64, u64)>,
    verifying_sent: bool,
    finished: bool,
}

impl Lines {
    fn push(&mut self, p: &Progress) {
        self.queue.push_back(to_json(p) + "\n");
    }

    fn downloading(&mut self, completed: u64, total: u64) {
        if self.reported == Some((completed, total)) {
            return;
        }
        self.reported = Some((completed, total));
        let p = Progress {
            status: format!("downloading {}", self.plan.digest),
            digest: Some(self.plan.digest.clone()),
            total: Some(total),
            completed: Some(completed),
        };
        self.push(&p);
    }

    fn verifying(&mut self) {
        if !self.verifying_sent {
            self.verifying_sent = true;
            self.push(&Progress::status("verifying sha256 digest"));
        }
    }

    /// Waits a little for the download and queues what it shows.
    async fn advance(&mut self) {
        let done = tokio::time::timeout(POLL, &mut self.task).await;
        match done {
            Err(_elapsed) => {
                if let Some(p) = self.downloads.progress(&self.plan.id) {
                    if p.needed > 0 {
                        self.downloading(p.done, p.needed);
                    }
                    if p.state == shoal_transfer::FetchState::Finishing {
                        self.verifying();
                    }
                }
            }
            Ok(Ok(Ok(path))) => {
                let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                self.downloading(size, size);
                self.verifying();
                self.push(&Progress::status("success"));
                self.finished = true;
            }
            Ok(Ok(Err(e))) => {
                tracing::warn!(model = %self.plan.id, "pull failed: {e}");
                self.queue
                    .push_back(json!({ "error": e.to_string() }).to_string() + "\n");
                self.finished = true;
            }
            Ok(Err(e)) => {
                let err = Error(ApiError::Internal(format!("the download task failed: {e}")));
                self.queue.push_back(err.line().to_string() + "\n");
                self.finished = true;
            }
        }
    }
}

/// The progress lines of a started download.
fn lines(
    downloads: Downloads,
    plan: Plan,
    task: JoinHandle<Result<std::path::PathBuf, TransferError>>,
) -> impl futures::Stream<Item = String> + Send + 'static {
    let mut st = Lines {
        downloads,
        plan,
        task,
        queue: Default::default(),
        reported: None,
        verifying_sent: false,
        finished: false,
    };
    st.push(&Progress::status("pulling manifest"));
    super::stream::drain(st)
}

impl super::stream::LineSource for Lines {
    fn queue(&mut self) -> &mut std::collections::VecDeque<String> {
        &mut self.queue
    }

    fn finished(&self) -> bool {
        self.finished
    }

    fn step(&mut self) -> impl std::future::Future<Output = ()> + Send {
        self.advance()
    }
}
