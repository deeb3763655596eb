//! What can go wrong, classified by what the caller may do next.
//!
//! The question that matters after a failure is *did it happen?* A
//! [`ClientError::Transport`] or [`ClientError::Timeout`] leaves the outcome
//! unknown (the request may have reached the server); an [`ApiError`] is an
//! answer, so the outcome is known. [`ClientError::is_retryable`] says which
//! failures another entry point may fix.

use http::StatusCode;
use std::time::Duration;

/// A JSON error answer from a gateway: `{"code", "error_code", "message"}`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {error_code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// warren's stable machine-readable name (`node_down`,
    /// `upstream_unreachable`, `not_found`, ...); empty when the body had none
    /// (e.g. a load balancer's own error page).
    pub error_code: String,
    /// The human-readable message.
    pub message: String,
}

impl ApiError {
    /// Builds one from a status and a body that may or may not be warren's JSON.
    pub fn from_body(status: StatusCode, body: &[u8]) -> ApiError {
        let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let field = |k: &str| json.get(k).and_then(|v| v.as_str()).map(str::to_string);
        // E2B's proxy's answer for a sandbox that is gone carries no
        // `error_code`, only `sandboxId`: it is the same cause.
        let gone = status == StatusCode::BAD_GATEWAY && json.get("sandboxId").is_some();
        ApiError {
            status,
            error_code: field("error_code")
                .or_else(|| gone.then(|| "sandbox_not_found".to_string()))
                .unwrap_or_default(),
            message: field("message")
                .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect()),
        }
    }

    /// The sandbox's node is known to be down (its lease expired).
    pub fn is_node_down(&self) -> bool {
        self.error_code == "node_down"
    }

    /// The gateway could not connect to the sandbox's node.
    pub fn is_upstream_unreachable(&self) -> bool {
        self.error_code == "upstream_unreachable"
    }

    /// The sandbox does not exist (any more): a 404 on the control plane,
    /// E2B's 502 "The sandbox was not found" on the data plane.
    pub fn is_sandbox_not_found(&self) -> bool {
        self.error_code == "sandbox_not_found"
    }

    /// Statuses that another entry point (or a moment later) may answer
    /// differently: the entry point's own trouble, not the request's. A
    /// `node_down` or `sandbox_not_found` answer is the truth about the
    /// sandbox, so it is final.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE
        ) && !self.is_node_down()
            && !self.is_sandbox_not_found()
    }
}

/// Every failure of a [`crate::Client`] call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The entry point could not be reached, or the connection broke before a
    /// full answer: the outcome is unknown.
    #[error("{entry}: {message}")]
    Transport {
        /// The entry point (`host:port`).
        entry: String,
        /// What the transport said.
        message: String,
    },
    /// No answer within the per-request timeout: the outcome is unknown.
    #[error("{entry}: no answer within {timeout:?}")]
    Timeout { entry: String, timeout: Duration },
    /// The gateway (or a balancer) answered with an error status.
    #[error("{entry}: {error}")]
    Api {
        entry: String,
        #[source]
        error: ApiError,
    },
    /// An answer that is not what the API promises.
    #[error("{entry}: unexpected answer: {message}")]
    Protocol { entry: String, message: String },
    /// The sandbox's node is down: its sandboxes are lost, no retry helps.
    #[error("sandbox {sandbox_id} is on a node that is down")]
    NodeDown { sandbox_id: String },
    /// The command stream failed in a way a reconnect cannot fix (the
    /// process or sandbox is gone, or its retained output no longer reaches
    /// back to the offset this client had).
    #[error("command stream: {message}")]
    Stream {
        /// The Connect error code (`not_found`, `out_of_range`, ...).
        code: String,
        message: String,
    },
    /// Every attempt failed; `last` is the final failure.
    #[error("gave up after {attempts} attempt(s): {last}")]
    Exhausted {
        attempts: u32,
        /// Some attempt got no answer: it may have taken effect even though
        /// the last one failed cleanly.
        unknown: bool,
        #[source]
        last: Box<ClientError>,
    },
    /// The caller passed something unusable (a bad URL or header value).
    #[error("invalid input: {0}")]
    Invalid(String),
}

impl ClientError {
    /// Another attempt (through another entry point) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Transport { .. } | ClientError::Timeout { .. } => true,
            ClientError::Api { error, .. } => error.is_retryable(),
            _ => false,
        }
    }

    /// The request may or may not have taken effect.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            ClientError::Transport { .. } | ClientError::Timeout { .. } => true,
            ClientError::Exhausted { last, unknown, .. } => *unknown || last.outcome_unknown(),
            _ => false,
        }
    }

    /// The API error behind this one, if it is (or ended with) an answer.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            ClientError::Api { error, .. } => Some(error),
            ClientError::Exhausted { last, .. } => last.api(),
            _ => None,
        }
    }

    /// A short stable name for reports: `transport`, `timeout`, the API's
    /// `error_code` (or `http_<status>`), `node_down`, `stream_<code>`, ...
    pub fn kind(&self) -> String {
        match self {
            ClientError::Transport { .. } => "transport".into(),
            ClientError::Timeout { .. } => "timeout".into(),
            ClientError::Api { error, .. } if !error.error_code.is_empty() => {
                error.error_code.clone()
            }
            ClientError::Api { error, .. } => format!("http_{}", error.status.as_u16()),
            ClientError::Protocol { .. } => "protocol".into(),
            ClientError::NodeDown { .. } => "node_down".into(),
            ClientError::Stream { code, .. } => format!("stream_{code}"),
            ClientError::Exhausted { last, .. } => last.kind(),
            ClientError::Invalid(_) => "invalid".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warren_json_errors_are_parsed_and_balancer_pages_are_kept_short() {
        let e = ApiError::from_body(
            StatusCode::BAD_GATEWAY,
            br#"{"code":502,"error_code":"node_down","message":"sandbox x is on a node that is down"}"#,
        );
        assert!(e.is_node_down() && !e.is_retryable());
        let html = "<html>".repeat(100);
        let e = ApiError::from_body(StatusCode::SERVICE_UNAVAILABLE, html.as_bytes());
        assert_eq!(e.error_code, "");
        assert_eq!(e.message.len(), 200);
        let err = ClientError::Api {
            entry: "lb".into(),
            error: e,
        };
        assert_eq!(err.kind(), "http_503");
        assert!(err.is_retryable() && !err.outcome_unknown());
    }

    #[test]
    fn transport_failures_leave_the_outcome_unknown() {
        let err = ClientError::Exhausted {
            attempts: 3,
            unknown: false,
            last: Box::new(ClientError::Transport {
                entry: "a".into(),
                message: "reset".into(),
            }),
        };
        assert!(err.outcome_unknown());
        assert_eq!(err.kind(), "transport");
        // A clean last answer does not settle an earlier attempt that got none.
        let err = ClientError::Exhausted {
            attempts: 2,
            unknown: true,
            last: Box::new(ClientError::Api {
                entry: "b".into(),
                error: ApiError::from_body(StatusCode::SERVICE_UNAVAILABLE, b"{}"),
            }),
        };
        assert!(err.outcome_unknown());
    }
}
