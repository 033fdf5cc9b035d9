//! Cancelling a request by id: `POST /v1/cancel/{id}`.
//!
//! Every request a client may cancel gets a [`Ticket`] before it is submitted: 96 random bits (its
//! token) that every id the client sees for it ends with (`chatcmpl-<token>`, `cmpl-<token>`,
//! Responses' `resp_<token>`, Anthropic's `msg_<token>`), the seed of its tool-call ids, and its
//! [`Owner`] — the API key that started it when the server has keys, else the client's address. Ids
//! cannot be guessed, and only the owner may cancel: anyone else gets the same 404 as for an id that
//! does not exist, so the route tells a stranger nothing.
//!
//! The route finds the ticket in [`Cancellations`] (the tickets of requests still being answered) and
//! asks the engine to stop each of its sequences ([`shoal_engine::EngineHandle::cancel`]). The engine
//! ends a cancelled request itself, queued or running, with a `Done { Cancelled }` event, which the
//! handler still holding the stream reads as a cancellation by id ([`crate::generate::Outcome`]): a
//! non-streaming request answers 409 ([`ApiError::Cancelled`]), a stream ends with a `cancelled` error
//! event and `[DONE]`. The registry is what only the API knows — which client-visible id names which
//! engine sequences, and whose request it is (decision 019); it keeps no flag of its own.
//!
//! Handlers hold each submitted request as a [`LiveRequest`], which pairs the engine's
//! [`RequestStream`] with its ticket and drops the ticket from the registry when the last of the
//! request's choices is dropped, so the registry only ever holds tickets of requests still answered.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, Path, State};
use axum::http::request::Parts;
use serde::Serialize;
use sha2::{Digest, Sha256};
use shoal_engine::RequestStream;

use crate::ApiState;
use crate::error::ApiError;

/// Prefixes of the response ids the routes build from a ticket's token.
const ID_PREFIXES: [&str; 4] = ["chatcmpl-", "cmpl-", "resp_", "msg_"];

/// Random bytes in a token (rendered as twice as many hex digits).
const TOKEN_BYTES: usize = 12;

/// Who started a request, and so who may cancel it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The sha256 of the API key the request presented (a server with keys).
    Key([u8; 32]),
    /// The client's address (a server without keys).
    Address(IpAddr),
    /// Neither is known (a router driven without a socket, as in tests).
    Unknown,
}

/// The [`Owner`] of the request being handled, as an extractor.
#[derive(Debug, Clone)]
pub struct Caller(pub Owner);

impl FromRequestParts<ApiState> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ApiState,
    ) -> Result<Self, Self::Rejection> {
        let key = state
            .api_keys
            .as_ref()
            .and_then(|_| crate::auth::presented(&parts.headers))
            .map(|k| Owner::Key(Sha256::digest(k.as_bytes()).into()));
        let address = || {
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| Owner::Address(c.0.ip()))
        };
        Ok(Caller(key.or_else(address).unwrap_or(Owner::Unknown)))
    }
}

/// A request as the cancel route knows it (see the module doc).
#[derive(Debug)]
pub struct Ticket {
    token: String,
    seed: u64,
    owner: Owner,
    /// The engine ids of its sequences still held by the handler (one per choice).
    engine_ids: Mutex<Vec<u64>>,
}

impl Ticket {
    /// A new ticket for a request of `owner`, from the operating system's random source.
    pub fn new(owner: Owner) -> Result<Arc<Ticket>, ApiError> {
        let mut bytes = [0u8; TOKEN_BYTES + 8];
        getrandom::getrandom(&mut bytes)
            .map_err(|e| ApiError::Internal(format!("no random bytes for a request id: {e}")))?;
        let token = bytes[..TOKEN_BYTES]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut seed = [0u8; 8];
        seed.copy_from_slice(&bytes[TOKEN_BYTES..]);
        Ok(Arc::new(Ticket {
            token,
            seed: u64::from_le_bytes(seed),
            owner,
            engine_ids: Mutex::new(Vec::new()),
        }))
    }

    /// The random part of every id the client sees for this request.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A seed for the request's tool-call ids (random, different for every request).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn ids(&self) -> MutexGuard<'_, Vec<u64>> {
        // Consistent even if a holder panicked: every operation is a single push/retain/clone.
        self.engine_ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Tickets of the requests still being answered, by token.
#[derive(Debug, Default)]
pub struct Cancellations {
    live: Mutex<HashMap<String, Arc<Ticket>>>,
}

impl Cancellations {
    fn live(&self) -> MutexGuard<'_, HashMap<String, Arc<Ticket>>> {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The live ticket with `token`, when `caller` owns it.
    fn owned(&self, token: &str, caller: &Owner) -> Option<Arc<Ticket>> {
        self.live()
            .get(token)
            .filter(|t| t.owner == *caller)
            .cloned()
    }

    /// The tokens of the requests that hold a ticket now (for the node's own tests and diagnostics;
    /// never served to clients).
    pub fn tokens(&self) -> Vec<String> {
        self.live().keys().cloned().collect()
    }

    /// How many requests hold a ticket now.
    pub fn len(&self) -> usize {
        self.live().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A submitted request as a handler holds it: the engine's event stream plus, for a request clients
/// may cancel, its [`Ticket`]. Dropping it drops the stream (the engine then frees the sequence).
pub struct LiveRequest {
    stream: RequestStream,
    ticket: Option<Arc<Ticket>>,
    cancellations: Arc<Cancellations>,
}

impl LiveRequest {
    /// `stream` held under `ticket` (registered for the cancel route), or without one.
    pub fn new(
        stream: RequestStream,
        ticket: Option<Arc<Ticket>>,
        cancellations: Arc<Cancellations>,
    ) -> Self {
        if let Some(t) = &ticket {
            t.ids().push(stream.id());
            cancellations
                .live()
                .entry(t.token.clone())
                .or_insert_with(|| t.clone());
        }
        LiveRequest {
            stream,
            ticket,
            cancellations,
        }
    }

    /// The engine's id of this sequence (for logs).
    pub fn id(&self) -> u64 {
        self.stream.id()
    }

    pub fn stream(&mut self) -> &mut RequestStream {
        &mut self.stream
    }

    /// The prompt's length in tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.stream.prompt_tokens()
    }
}

impl Drop for LiveRequest {
    fn drop(&mut self) {
        let Some(t) = &self.ticket else { return };
        let id = self.stream.id();
        let mut ids = t.ids();
        ids.retain(|&i| i != id);
        if ids.is_empty() {
            drop(ids);
            self.cancellations.live().remove(&t.token);
        }
    }
}

/// The token behind a client-visible id: `chatcmpl-T`, `cmpl-T`, `resp_T`, `msg_T` or `T`, `T` a token
/// (lower-case hex of the right length).
pub fn parse_request_id(id: &str) -> Option<&str> {
    let token = ID_PREFIXES
        .iter()
        .find_map(|p| id.strip_prefix(p))
        .unwrap_or(id);
    (token.len() == 2 * TOKEN_BYTES
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(token)
}

/// The answer to a successful cancellation.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Cancellation {
    /// The id as the client gave it.
    pub id: String,
    pub object: &'static str,
    pub cancelled: bool,
}

/// `POST /v1/cancel/{id}`: 200 when the caller's request was live, 404 when no request of the caller's
/// with that id is queued or running, 400 when the id is not a request id.
#[utoipa::path(
    post,
    path = "/v1/cancel/{id}",
    operation_id = "post_v1_cancel_id",
    tag = "openai",
    params(("id" = String, Path, description = "The response id (`chatcmpl-…`, `cmpl-…`, `resp_…`, `msg_…`).")),
    responses(
        (status = 200, description = "The request was live and is cancelled.", body = Cancellation),
        crate::schema::OpenAiErrors
    )
)]
pub async fn cancel_request(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<Cancellation>, ApiError> {
    let Some(token) = parse_request_id(&id) else {
        return Err(ApiError::InvalidRequest {
            message: format!(
                "'{}' is not a request id (expected the id of a response: chatcmpl-…, cmpl-…, resp_… or msg_…)",
                id.chars().take(80).collect::<String>()
            ),
            param: Some("id".into()),
            code: Some("invalid_request_id"),
        });
    };
    let Some(ticket) = state.cancellations.owned(token, &caller) else {
        return Err(ApiError::RequestNotFound { id });
    };
    let ids = ticket.ids().clone();
    let mut stopped = false;
    for engine_id in ids {
        stopped |= state.engine.cancel(engine_id);
    }
    if !stopped {
        return Err(ApiError::RequestNotFound { id });
    }
    tracing::debug!(request = %ticket.token, "cancelled by id");
    Ok(Json(Cancellation {
        id,
        object: "cancellation",
        cancelled: true,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_client_ids() {
        let t = "0123456789abcdef01234567";
        for id in [
            format!("chatcmpl-{t}"),
            format!("cmpl-{t}"),
            format!("resp_{t}"),
            format!("msg_{t}"),
            t.to_string(),
        ] {
            assert_eq!(parse_request_id(&id), Some(t), "{id}");
        }
        for bad in [
            "",
            "chatcmpl-",
            "chatcmpl-12",
            "7",
            "cmpl-x",
            "0123456789ABCDEF01234567",
            "0123456789abcdef0123456",
            "0123456789abcdef012345678",
            "resp-0123456789abcdef01234567",
        ] {
            assert_eq!(parse_request_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn tickets_are_unguessable_and_distinct() {
        let a = Ticket::new(Owner::Unknown).unwrap();
        let b = Ticket::new(Owner::Unknown).unwrap();
        assert_ne!(a.token(), b.token());
        assert_ne!(a.seed(), b.seed());
        assert_eq!(parse_request_id(a.token()), Some(a.token()));
    }

    #[test]
    fn only_the_owner_finds_a_ticket() {
        let registry = Cancellations::default();
        let owner = Owner::Address("10.0.0.1".parse().unwrap());
        let t = Ticket::new(owner.clone()).unwrap();
        registry.live().insert(t.token.clone(), t.clone());
        assert!(registry.owned(t.token(), &owner).is_some());
        assert!(
            registry
                .owned(t.token(), &Owner::Address("10.0.0.2".parse().unwrap()))
                .is_none()
        );
        assert!(registry.owned(t.token(), &Owner::Key([0; 32])).is_none());
    }
}
