//! The model routes: `GET /api/tags` (every model this node knows), `GET /api/ps` (the loaded ones),
//! `POST /api/show` (one model's details, template and GGUF metadata), `DELETE /api/delete` (a model's
//! files in this node's store).
//!
//! [`known`] gathers the models, each once, in this order of sources: this node's store (complete models:
//! the file's size and time, its sha256 from `model.json`, the catalog or the transfer manifest beside it,
//! and [`GgufFacts`] from its header), the models the cluster's members publish in their facts (size from
//! the model card), and the engines of this node (a bare engine knows only its id and context length).
//! Reading headers and hashes touches the disk, so it runs on the blocking pool.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use serde_json::{Value, json};

use super::details::GgufFacts;
use super::types::{
    ListedModel, ModelDetails, ModelRequest, PsResponse, RunningModel, ShowResponse, TagsResponse,
};
use super::{Error, rfc3339};
use crate::ApiState;
use crate::error::ApiError;

/// A model this node can tell clients about.
#[derive(Debug, Clone)]
pub struct Known {
    pub id: String,
    /// Its complete GGUF on this node.
    pub file: Option<PathBuf>,
    pub size: u64,
    /// Lowercase hex sha256 of the file, empty when unknown.
    pub digest: String,
    pub modified: SystemTime,
    /// The header's facts (read for local files only).
    pub facts: Option<GgufFacts>,
}

impl Known {
    fn details(&self) -> ModelDetails {
        match &self.facts {
            Some(f) => f.details(),
            None => ModelDetails {
                format: "gguf".into(),
                ..ModelDetails::default()
            },
        }
    }
}

/// Every model this node knows (see the module doc) that `wanted` accepts by id. Blocking.
pub fn known(state: &ApiState, wanted: &dyn Fn(&str) -> bool) -> Vec<Known> {
    let mut out: Vec<Known> = Vec::new();
    if let Some(downloads) = &state.downloads {
        let store = downloads.store();
        for entry in store.list() {
            let Some(file) = entry.file.clone() else {
                continue;
            };
            if entry.state != shoal_store::State::Complete || !wanted(&entry.id) {
                continue;
            }
            let meta = std::fs::metadata(&file).ok();
            let facts = GgufFacts::read(&file, false)
                .map_err(|e| tracing::debug!(model = %entry.id, "no GGUF details: {e}"))
                .ok();
            out.push(Known {
                digest: local_digest(store, &entry, &file),
                size: meta.as_ref().map_or(entry.size, |m| m.len()),
                modified: meta.and_then(|m| m.modified().ok()).unwrap_or(UNIX_EPOCH),
                id: entry.id,
                file: Some(file),
                facts,
            });
        }
    }
    if let Some(cluster) = &state.cluster {
        let snap = cluster.snapshot();
        for facts in snap.state.member_facts() {
            for card in &facts.models {
                if !wanted(&card.id) || out.iter().any(|k| k.id == card.id) {
                    continue;
                }
                out.push(Known {
                    id: card.id.to_string(),
                    file: None,
                    size: card.stage_bytes(card.n_layers, true, true, 0),
                    digest: String::new(),
                    modified: UNIX_EPOCH + std::time::Duration::from_secs(facts.started),
                    facts: None,
                });
            }
        }
    }
    for info in state.engine.models() {
        if !wanted(&info.id) || out.iter().any(|k| k.id == info.id) {
            continue;
        }
        out.push(Known {
            id: info.id,
            file: None,
            size: 0,
            digest: String::new(),
            modified: UNIX_EPOCH + std::time::Duration::from_secs(info.created),
            facts: None,
        });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// The sha256 of a store model's file: `model.json`, the catalog, or the transfer manifest kept beside
/// the file (never computed here).
fn local_digest(
    store: &shoal_store::Store,
    entry: &shoal_store::ModelEntry,
    file: &std::path::Path,
) -> String {
    if let Some(sha) = store.info(&entry.dir).ok().flatten().and_then(|i| i.sha256) {
        return sha;
    }
    if let Some(e) = shoal_store::find(&entry.id) {
        return e.sha256.to_string();
    }
    if shoal_transfer::manifest::sidecar_path(file).is_file()
        && let Ok(m) = shoal_transfer::Manifest::load_or_compute(file)
        && let Some(sha) = m.sha256
    {
        return sha;
    }
    String::new()
}

/// [`known`] on the blocking pool.
async fn known_async(
    state: &ApiState,
    wanted: impl Fn(&str) -> bool + Send + 'static,
) -> Result<Vec<Known>, Error> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || known(&state, &wanted))
        .await
        .map_err(|e| Error(ApiError::Internal(format!("listing models: {e}"))))
}

/// `GET /api/tags`.
#[utoipa::path(
    get,
    path = "/api/tags",
    operation_id = "get_api_tags",
    tag = "ollama",
    responses(
        (status = 200, description = "The models this node's store and the cluster know.", body = TagsResponse),
        crate::schema::OllamaErrors
    )
)]
pub async fn tags(State(state): State<ApiState>) -> Result<Json<TagsResponse>, Error> {
    let models: Vec<ListedModel> = known_async(&state, |_| true)
        .await?
        .into_iter()
        .map(|k| ListedModel {
            name: k.id.clone(),
            model: k.id.clone(),
            modified_at: rfc3339(k.modified),
            size: k.size,
            digest: k.digest.clone(),
            details: k.details(),
        })
        .collect();
    Ok(Json(TagsResponse { models }))
}

/// Loaded models never expire by themselves: they stay until their instance is removed.
const NEVER: &str = "9999-12-31T23:59:59Z";

/// `GET /api/ps`: the models with a ready instance this node answers for (its engines and those other
/// members drive).
#[utoipa::path(
    get,
    path = "/api/ps",
    operation_id = "get_api_ps",
    tag = "ollama",
    responses(
        (status = 200, description = "The models with a ready instance.", body = PsResponse),
        crate::schema::OllamaErrors
    )
)]
pub async fn ps(State(state): State<ApiState>) -> Result<Json<PsResponse>, Error> {
    let served = crate::cluster::served_models(&state);
    let ids: Vec<String> = served.iter().map(|m| m.id.clone()).collect();
    let known = known_async(&state, move |id| ids.iter().any(|m| m == id)).await?;
    let models: Vec<RunningModel> = served
        .into_iter()
        .map(|info| {
            let k = known.iter().find(|k| k.id == info.id);
            RunningModel {
                name: info.id.clone(),
                model: info.id,
                size: k.map_or(0, |k| k.size),
                digest: k.map(|k| k.digest.clone()).unwrap_or_default(),
                details: k.map(Known::details).unwrap_or_default(),
                expires_at: NEVER.into(),
                size_vram: 0,
                context_length: info.context_length,
            }
        })
        .collect();
    Ok(Json(PsResponse { models }))
}

/// The known model `name` names (itself, or without an Ollama-style `:latest`).
fn find(known: Vec<Known>, name: &str) -> Option<Known> {
    let base = name.strip_suffix(":latest");
    let mut known = known;
    let at = known
        .iter()
        .position(|k| k.id == name)
        .or_else(|| base.and_then(|b| known.iter().position(|k| k.id == b)))?;
    Some(known.swap_remove(at))
}

/// `POST /api/show`.
#[utoipa::path(
    post,
    path = "/api/show",
    operation_id = "post_api_show",
    tag = "ollama",
    request_body = super::types::ModelRequest,
    responses(
        (status = 200, description = "The model's details.", body = super::types::ShowResponse),
        crate::schema::OllamaErrors
    )
)]
pub async fn show(
    State(state): State<ApiState>,
    body: Result<Json<ModelRequest>, JsonRejection>,
) -> Result<Json<ShowResponse>, Error> {
    let Json(req) = body?;
    let name = req.model()?;
    // Only ever compared with the ids of known models, but a name that is no model id (a path, `..`,
    // NUL, over-long) is refused as such, as on every route that takes a model name.
    shoal_store::check_model_id(&name).map_err(|e| ApiError::invalid("model", e.to_string()))?;
    let verbose = req.verbose.unwrap_or(false);
    let wanted = name.clone();
    let known = known_async(&state, move |id| {
        id == wanted || wanted.strip_suffix(":latest") == Some(id)
    })
    .await?;
    let Some(mut model) = find(known, &name) else {
        return Err(ApiError::ModelNotFound { model: name }.into());
    };
    if verbose && let Some(file) = model.file.clone() {
        model.facts = tokio::task::spawn_blocking(move || GgufFacts::read(&file, true).ok())
            .await
            .ok()
            .flatten();
    }
    let context = state
        .engine
        .get(&model.id)
        .ok()
        .map(|e| e.info().context_length as u64)
        .or_else(|| model.facts.as_ref().and_then(GgufFacts::context_length));
    let template = model
        .facts
        .as_ref()
        .map(|f| f.template.clone())
        .unwrap_or_default();
    let parameters = context.map(|c| format!("num_ctx {c}")).unwrap_or_default();
    // Tools go through the chat template (shoal-guide teaches the call form to one that has none).
    let chat = !template.is_empty()
        || state
            .engine
            .get(&model.id)
            .is_ok_and(|e| e.chat_template().is_some());
    let mut capabilities = vec!["completion"];
    if chat {
        capabilities.push("tools");
    }
    let mut modelfile = format!(
        "# Modelfile of {} as shoal serves it\nFROM {}\n",
        model.id, model.id
    );
    if !template.is_empty() {
        modelfile.push_str(&format!("TEMPLATE \"\"\"{template}\"\"\"\n"));
    }
    if !parameters.is_empty() {
        modelfile.push_str(&format!("PARAMETER {parameters}\n"));
    }
    Ok(Json(ShowResponse {
        modelfile,
        parameters,
        template,
        details: model.details(),
        model_info: model
            .facts
            .as_ref()
            .map(|f| f.model_info.clone())
            .unwrap_or_default(),
        capabilities,
        modified_at: rfc3339(model.modified),
    }))
}

/// `DELETE /api/delete`: removes a complete model's folder from this node's store (a hub model's shared
/// cache stays, as with `shoal rm`) and stops offering it to the cluster. A running instance keeps
/// serving from memory until it is removed.
#[utoipa::path(
    delete,
    path = "/api/delete",
    operation_id = "delete_api_delete",
    tag = "ollama",
    request_body = super::types::ModelRequest,
    responses(
        (status = 200, description = "Removed from this node's store.", body = Object),
        crate::schema::OllamaErrors
    )
)]
pub async fn delete(
    State(state): State<ApiState>,
    body: Result<Json<ModelRequest>, JsonRejection>,
) -> Result<Json<Value>, Error> {
    let Json(req) = body?;
    let name = req.model()?;
    shoal_store::check_model_id(&name).map_err(|e| ApiError::invalid("model", e.to_string()))?;
    let not_found = || {
        Error(ApiError::ModelNotFound {
            model: name.clone(),
        })
    };
    let store = state
        .downloads
        .as_ref()
        .ok_or_else(not_found)?
        .store()
        .clone();
    let id = {
        let wanted = name.clone();
        tokio::task::spawn_blocking(move || {
            let base = wanted
                .strip_suffix(":latest")
                .unwrap_or(&wanted)
                .to_string();
            let present = store.present();
            let id = [wanted.clone(), base]
                .into_iter()
                .find(|id| present.contains(id))?;
            Some(store.remove(&id, false).map(|_| id))
        })
        .await
        .map_err(|e| Error(ApiError::Internal(format!("deleting a model: {e}"))))?
    };
    let id = match id {
        None => return Err(not_found()),
        Some(Err(e)) => return Err(Error(ApiError::Internal(e.to_string()))),
        Some(Ok(id)) => id,
    };
    tracing::info!(model = %id, "deleted through /api/delete");
    if let Some(cluster) = &state.cluster {
        let me = cluster.id().to_string();
        let cards = cluster.snapshot().state.facts_of(&me).map(|f| {
            f.models
                .iter()
                .filter(|c| c.id != id)
                .cloned()
                .collect::<Vec<_>>()
        });
        if let Some(cards) = cards {
            cluster.set_models(cards).await;
        }
    }
    Ok(Json(json!({ "status": "success" })))
}
