//! `POST /doctor`: fresh measurements of the link to every peer ([`shoal_cluster::doctor`]), for the
//! `shoal doctor` command. The body is optional: `{"pings": 50, "transfer_ms": 2000}` (bounded, so
//! one call stays within about a minute per peer).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};
use shoal_cluster::doctor::DoctorOptions;

use crate::{ApiError, ApiState};

/// The most pings per peer one call may ask for.
const MAX_PINGS: usize = 1000;
/// The longest transfer one call may ask for, each way.
const MAX_TRANSFER_MS: u64 = 10_000;

/// What a caller may change.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DoctorBody {
    pings: Option<usize>,
    transfer_ms: Option<u64>,
}

impl DoctorBody {
    fn options(&self) -> Result<DoctorOptions, ApiError> {
        let mut opts = DoctorOptions::default();
        if let Some(n) = self.pings {
            if n == 0 || n > MAX_PINGS {
                return Err(ApiError::invalid(
                    "pings",
                    format!("pings must be between 1 and {MAX_PINGS}"),
                ));
            }
            opts.pings = n;
        }
        if let Some(ms) = self.transfer_ms {
            if ms == 0 || ms > MAX_TRANSFER_MS {
                return Err(ApiError::invalid(
                    "transfer_ms",
                    format!("transfer_ms must be between 1 and {MAX_TRANSFER_MS}"),
                ));
            }
            opts.transfer_for = std::time::Duration::from_millis(ms);
        }
        Ok(opts)
    }
}

/// `POST /doctor`: `{"node": ID, "name": HOST, "peers": [PeerReport…]}`.
#[utoipa::path(
    post,
    path = "/doctor",
    operation_id = "post_doctor",
    tag = "cluster",
    request_body = Option<DoctorBody>,
    responses(
        (status = 200, description = "`{\"node\", \"name\", \"peers\": […]}`: fresh link measurements to every peer.", body = Object),
        crate::schema::OpenAiErrors
    )
)]
pub async fn doctor(
    State(state): State<ApiState>,
    // No body, or `null`: the defaults; a malformed one is a 400 in OpenAI's shape.
    body: Result<Option<Json<Option<DoctorBody>>>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let c = state.cluster()?;
    let opts = body?.and_then(|Json(b)| b).unwrap_or_default().options()?;
    let peers = c.doctor(opts).await?;
    let snap = c.snapshot();
    let me = snap.state.me();
    Ok(Json(
        json!({ "node": me.id, "name": me.name, "peers": peers }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_bounded() {
        let ok = DoctorBody {
            pings: Some(10),
            transfer_ms: Some(500),
        };
        let o = ok.options().expect("valid");
        assert_eq!(o.pings, 10);
        assert_eq!(o.transfer_for, std::time::Duration::from_millis(500));
        for bad in [
            DoctorBody {
                pings: Some(0),
                transfer_ms: None,
            },
            DoctorBody {
                pings: None,
                transfer_ms: Some(60_000),
            },
        ] {
            assert!(bad.options().is_err());
        }
        assert_eq!(
            DoctorBody::default().options().expect("defaults").pings,
            DoctorOptions::default().pings
        );
    }
}
