//! Errors the gateway answers with, as JSON.
//!
//! Every error is `{"code": <status>, "error_code": "<stable name>",
//! "message": "..."}`: `code` and `message` are what the e2b SDK reads (its
//! `Error` model), `error_code` is E2B's machine-readable field, a stable
//! string a client can branch on (e.g. `node_down` vs `upstream_unreachable`,
//! both 502). Distinct causes get distinct messages; the table is in
//! docs/internals.md ("Gateway errors").

use http::{header, HeaderValue, Response, StatusCode};
use tonic::Code;
use warren_core::body::{json, Body};
use warren_proto::{REASON_METADATA, REASON_NODE_DOWN, REASON_NO_CAPACITY};

/// Seconds a client is told to wait before retrying a 503.
pub const RETRY_AFTER_SECS: u64 = 1;

/// An error response.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {error_code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable name of the cause.
    pub error_code: &'static str,
    /// What went wrong, for people.
    pub message: String,
    /// Sent as `Retry-After` (seconds) when set.
    pub retry_after: Option<u64>,
    /// Sent as `Should-Retry` when set: the e2b SDK retries 502/503/504
    /// unless told not to.
    pub should_retry: Option<bool>,
    /// Set on [`ApiError::sandbox_gone`] only: the body is then exactly
    /// E2B's proxy's, `{"message", "sandboxId", "code"}` (clients compare
    /// the message), without `error_code`.
    pub gone_sandbox: Option<String>,
}

#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    code: u16,
    error_code: &'a str,
    message: &'a str,
}

/// E2B's proxy's answer for a sandbox that is not there (any more).
#[derive(serde::Serialize)]
struct GoneBody<'a> {
    message: &'a str,
    #[serde(rename = "sandboxId")]
    sandbox_id: &'a str,
    code: u16,
}

/// The message of [`ApiError::sandbox_gone`], exactly E2B's.
pub const SANDBOX_GONE_MESSAGE: &str = "The sandbox was not found";

impl ApiError {
    /// An error with this status, stable code and message.
    pub fn new(status: StatusCode, error_code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            error_code,
            message: message.into(),
            retry_after: None,
            should_retry: None,
            gone_sandbox: None,
        }
    }

    /// 400: the client sent something malformed.
    pub fn bad_request(error_code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error_code, message)
    }

    /// 401: no or an unknown API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 429 for a bound the team stays past until it frees something (a
    /// snapshot, a template, a build): the message names the flag.
    /// `Should-Retry: false`: the SDKs retry a 429 without it, and waiting
    /// does not help.
    pub fn over_limit(error_code: &'static str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, error_code, message);
        e.should_retry = Some(false);
        e
    }

    /// 404 for a sandbox: unknown, or owned by another team (the same answer,
    /// so ids of other teams do not leak).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "sandbox_not_found",
            format!("sandbox {id} not found"),
        )
    }

    /// 502 on the data plane for a sandbox that does not exist (any more):
    /// what E2B's sandbox proxy answers for a killed or expired sandbox.
    /// The SDKs read a `502` whose message has "was not found" as "gone"
    /// (`is_running()` is false, a cut stream says the sandbox "was killed
    /// or reached its end of life"); a `404` would be the sandbox's own.
    /// `Should-Retry: false`: the SDK retries other 502s. The body is
    /// exactly E2B's: `{"message": "The sandbox was not found",
    /// "sandboxId": "<id>", "code": 502}`.
    pub fn sandbox_gone(id: &str) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_GATEWAY,
            "sandbox_not_found",
            SANDBOX_GONE_MESSAGE,
        );
        e.should_retry = Some(false);
        e.gone_sandbox = Some(id.to_string());
        e
    }

    /// 502 on the data plane for a paused sandbox created without
    /// auto-resume (E2B's default): the request does not resume it. The
    /// SDKs read a `502` as "not running" (`is_running()` is false);
    /// `Should-Retry: false`, since only a resume or connect helps.
    pub fn sandbox_paused(id: &str) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_GATEWAY,
            "sandbox_paused",
            format!(
                "The sandbox is paused: sandbox {id} was paused and is not resumed by \
                 requests (it was created without auto-resume); resume it \
                 (POST /sandboxes/{id}/resume, or Sandbox.connect in the SDK) first"
            ),
        );
        e.should_retry = Some(false);
        e
    }

    /// [`ApiError::sandbox_paused`] for a sandbox paused filesystem-only,
    /// which requests never resume, auto-resume or not (as on E2B).
    pub fn sandbox_paused_filesystem_only(id: &str) -> Self {
        let mut e = Self::sandbox_paused(id);
        e.message = format!(
            "The sandbox is paused: sandbox {id} was paused filesystem-only, which \
             requests do not resume; resume it (POST /sandboxes/{id}/resume, or \
             Sandbox.connect in the SDK) first"
        );
        e
    }

    /// The same error as the data plane answers it: a sandbox that is not
    /// found there is gone ([`ApiError::sandbox_gone`]).
    pub fn on_data_plane(self, id: &str) -> Self {
        if self.status == StatusCode::NOT_FOUND && self.error_code == "sandbox_not_found" {
            Self::sandbox_gone(id)
        } else {
            self
        }
    }

    /// 502: the sandbox's node lost its lease.
    pub fn node_down(id: &str) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "node_down",
            format!("sandbox {id} is on a node that is down"),
        )
    }

    /// 502: the TCP/HTTP connection to the node failed (not an HTTP error
    /// answered by the node).
    pub fn upstream_unreachable() -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream_unreachable",
            "Failed to reach sandbox (upstream connection error)",
        )
    }

    /// 503: the sandbox moved to another node while this request was on its
    /// way, and the request was not safe to send twice (a body that was
    /// streamed, a WebSocket, a streaming RPC, or a method without an
    /// `Idempotency-Key`). The client retries; its retry goes to the new node.
    /// The sandbox's node took the request but gave no answer within the
    /// request timeout: whether it acted is unknown (a pause or resume may
    /// have happened), so the client is told to look or retry, not that
    /// the gateway failed.
    pub fn upstream_timeout(what: &str, timeout: std::time::Duration) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream_timeout",
            format!(
                "the sandbox's node did not answer within {timeout:?}; the {what} may or may                  not have happened: check the sandbox, then retry"
            ),
        )
    }

    pub fn sandbox_moved(id: &str) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandbox_moved",
            format!(
                "sandbox {id} moved to another node while this request was in flight; \
                 the request was not replayed (it is not replay-safe): retry it"
            ),
        );
        e.retry_after = Some(RETRY_AFTER_SECS);
        e
    }

    /// 503: the scheduler names a node that has not finished creating (or
    /// moving) the sandbox yet.
    pub fn sandbox_not_ready(id: &str) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandbox_not_ready",
            format!("sandbox {id} is still being created on its node; retry shortly"),
        );
        e.retry_after = Some(RETRY_AFTER_SECS);
        e
    }

    /// 503: the scheduler cannot be reached or is failing; retry.
    pub fn routing_unavailable(detail: impl std::fmt::Display) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "routing_unavailable",
            format!("routing unavailable: {detail}"),
        );
        e.retry_after = Some(RETRY_AFTER_SECS);
        e
    }

    /// 500: a bug or an answer we did not expect.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_server_error",
            message,
        )
    }

    /// Maps a scheduler error for an RPC about sandbox `id` (if any).
    pub fn from_scheduler(status: &tonic::Status, id: Option<&str>) -> Self {
        let reason = status
            .metadata()
            .get(REASON_METADATA)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let shown = id.unwrap_or("?");
        match status.code() {
            Code::NotFound => match id {
                Some(id) => Self::sandbox_not_found(id),
                None => Self::new(StatusCode::NOT_FOUND, "not_found", status.message()),
            },
            Code::FailedPrecondition if reason == REASON_NODE_DOWN => Self::node_down(shown),
            Code::FailedPrecondition => Self::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("sandbox {shown}: {}", status.message()),
            ),
            Code::InvalidArgument => Self::bad_request("bad_request", status.message()),
            Code::ResourceExhausted if reason == REASON_NO_CAPACITY => {
                let mut e = Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "sandbox_capacity_unavailable",
                    format!(
                        "no node has capacity for a new sandbox: {}",
                        status.message()
                    ),
                );
                e.retry_after = Some(RETRY_AFTER_SECS);
                e
            }
            Code::ResourceExhausted => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "resource_exhausted",
                status.message(),
            ),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                Self::routing_unavailable(format!("scheduler: {}", status.message()))
            }
            other => Self::internal(format!(
                "scheduler answered {other:?}: {}",
                status.message()
            )),
        }
    }

    /// The JSON response.
    pub fn into_response(self) -> Response<Body> {
        let mut r = match &self.gone_sandbox {
            Some(id) => json(
                self.status,
                &GoneBody {
                    message: &self.message,
                    sandbox_id: id,
                    code: self.status.as_u16(),
                },
            ),
            None => json(
                self.status,
                &ErrorBody {
                    code: self.status.as_u16(),
                    error_code: self.error_code,
                    message: &self.message,
                },
            ),
        };
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(retry) = self.should_retry {
            r.headers_mut().insert(
                "should-retry",
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        r
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn futures_body(r: Response<Body>) -> serde_json::Value {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = rt.block_on(r.into_body().collect()).unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn classifies_scheduler_statuses() {
        let mut st = tonic::Status::failed_precondition("lost");
        st.metadata_mut().insert(
            REASON_METADATA,
            tonic::metadata::MetadataValue::from_static(REASON_NODE_DOWN),
        );
        let e = ApiError::from_scheduler(&st, Some("abc"));
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        assert_eq!(e.error_code, "node_down");
        assert_eq!(e.message, "sandbox abc is on a node that is down");

        let e = ApiError::from_scheduler(&tonic::Status::not_found("x"), Some("abc"));
        assert_eq!(e.message, "sandbox abc not found");

        let gone = ApiError::from_scheduler(&tonic::Status::not_found("x"), Some("abc"))
            .on_data_plane("abc");
        assert_eq!(gone.status, StatusCode::BAD_GATEWAY);
        assert_eq!(gone.message, "The sandbox was not found");
        let r = gone.into_response();
        assert_eq!(r.headers()["should-retry"], "false");
        let body = futures_body(r);
        assert_eq!(
            body,
            serde_json::json!({"message": "The sandbox was not found", "sandboxId": "abc", "code": 502})
        );

        let e = ApiError::from_scheduler(&tonic::Status::unavailable("down"), Some("abc"));
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
