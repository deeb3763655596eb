//! `POST /sandboxes/{id}/refreshes` (E2B's `SandboxRefreshRequest`): keep a
//! running sandbox alive for `duration` more seconds.
//!
//! As E2B: `duration` is 0 to 3600 seconds (absent: 0), raised to at least
//! [`MIN_REFRESH_SECS`]; the sandbox's end moves to now + duration when that
//! is later, and is never shortened (a refresh is a keep-alive, unlike
//! `POST /sandboxes/{id}/timeout`, which sets the end either way). `204`.
//! A paused sandbox is not running and never ends on its own: `409`, saying
//! to resume it. Another team's sandbox is `404`, like an unknown one.

use super::owned;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use warren_core::body::{status as no_content, Body};
use warren_core::time::now_ms;
use warren_proto::scheduler::v1::BindingState;

/// The least a refresh keeps a sandbox alive for (E2B's floor).
pub const MIN_REFRESH_SECS: u64 = 15;
/// The most one refresh asks for (E2B's `duration` maximum).
pub const MAX_REFRESH_SECS: u64 = 3600;

/// The refresh's duration in seconds, raised to the floor; a 400 naming
/// `duration` when it is not a whole number of seconds in range.
fn duration_secs(body: &[u8]) -> Result<u64, ApiError> {
    let obj = crate::models::object(body, true)?;
    let asked = match obj.get("duration") {
        None | Some(serde_json::Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .filter(|d| *d <= MAX_REFRESH_SECS)
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_body",
                    format!(
                        "field \"duration\" must be a whole number of seconds from 0 to \
                         {MAX_REFRESH_SECS}, not {v}"
                    ),
                )
            })?,
    };
    Ok(asked.max(MIN_REFRESH_SECS))
}

/// `POST /sandboxes/{id}/refreshes`.
pub(super) async fn refresh(
    app: &App,
    team: &Team,
    id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let secs = duration_secs(body)?;
    let b = owned(app, team, id).await?;
    match BindingState::try_from(b.state) {
        Ok(BindingState::Running) | Ok(BindingState::Creating) => {}
        Ok(BindingState::Paused) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "sandbox_paused",
                format!(
                    "sandbox {id} is paused: a paused sandbox does not end on its own; resume \
                     it (POST /sandboxes/{id}/resume) before keeping it alive"
                ),
            ))
        }
        _ => return Err(ApiError::sandbox_not_found(id)),
    }
    let wanted = now_ms() + secs as i64 * 1000;
    if wanted > b.end_at_ms {
        super::sandboxes::set_end(app, id, wanted).await?;
    }
    Ok(no_content(StatusCode::NO_CONTENT))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded_and_raised_to_the_floor() {
        assert_eq!(duration_secs(b"").unwrap(), 15);
        assert_eq!(duration_secs(b"{}").unwrap(), 15);
        assert_eq!(duration_secs(br#"{"duration": 0}"#).unwrap(), 15);
        assert_eq!(duration_secs(br#"{"duration": 14}"#).unwrap(), 15);
        assert_eq!(duration_secs(br#"{"duration": 600}"#).unwrap(), 600);
        assert_eq!(duration_secs(br#"{"duration": 3600}"#).unwrap(), 3600);
        for bad in [
            &br#"{"duration": 3601}"#[..],
            br#"{"duration": -1}"#,
            br#"{"duration": 1.5}"#,
            br#"{"duration": "60"}"#,
            b"[]",
        ] {
            let e = duration_secs(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
        let e = duration_secs(br#"{"duration": 3601}"#).unwrap_err();
        assert!(e.message.contains("duration"), "{}", e.message);
    }
}
