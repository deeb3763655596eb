//! The scheduler's error type and how it maps onto gRPC status codes
//! (the table in `docs/internals.md`).

use tonic::{Code, Status};
use warren_proto::{
    BOUND_METADATA, REASON_METADATA, REASON_NODE_DOWN, REASON_NO_CAPACITY, REASON_QUOTA,
};

/// Why a scheduler operation did not happen. Every variant but [`Error::Store`]
/// and [`Error::Corrupt`] is the caller's problem and is not worth retrying
/// unchanged; `Store` is worth retrying (the store may come back).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed input: bad ids, empty required fields, generation 0 or one
    /// that was never issued. Nothing was written.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such sandbox.
    #[error("{0}")]
    NotFound(String),
    /// Unknown node, stale incarnation, a fence that did not match, or a
    /// binding in the wrong state. Nothing was written.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The binding's (or the required) node lost its lease.
    #[error("{0}")]
    NodeDown(String),
    /// No live node has room.
    #[error("{0}")]
    NoCapacity(String),
    /// The team is at one of its quotas.
    #[error("{0}")]
    Quota(String),
    /// A write would take a team (or everyone) past a bound the caller
    /// named (`bound`: one of `warren_proto::BOUND_*`). Nothing was written.
    #[error("{message}")]
    Bound {
        message: String,
        bound: &'static str,
    },
    /// Insert-if-absent found the record there. Nothing was written.
    #[error("{0}")]
    AlreadyExists(String),
    /// The record is no longer at the version the writer read (another
    /// writer won). Nothing was written.
    #[error("{0}")]
    Aborted(String),
    /// A precondition failed for a reason the caller acts on (`reason`:
    /// one of `warren_proto::REASON_*`). Nothing was written.
    #[error("{message}")]
    Refused {
        message: String,
        reason: &'static str,
    },
    /// The caller's certificate does not allow this call.
    #[error("{0}")]
    PermissionDenied(String),
    /// A credential the call carries (a volume's token) does not open
    /// what it names.
    #[error("{0}")]
    Unauthenticated(String),
    /// The store failed (I/O, busy, connection); retry later.
    #[error("store failure: {0}")]
    Store(#[from] sqlx::Error),
    /// A stored row could not be read back (a bug or a hand-edited database).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// A store operation's task ended without an answer (it panicked, or the
    /// runtime is shutting down).
    #[error("store operation failed: {0}")]
    Internal(String),
}

impl Error {
    /// Shorthand for a rejected fence or wrong state.
    pub fn precondition(msg: impl Into<String>) -> Self {
        Error::FailedPrecondition(msg.into())
    }

    /// Shorthand for malformed input.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

impl From<warren_core::id::InvalidId> for Error {
    fn from(e: warren_core::id::InvalidId) -> Self {
        Error::InvalidArgument(e.to_string())
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let with_reason = |code: Code, msg: String, reason: &'static str| {
            let mut status = Status::new(code, msg);
            if let Ok(v) = reason.parse() {
                status.metadata_mut().insert(REASON_METADATA, v);
            }
            status
        };
        match e {
            Error::InvalidArgument(m) => Status::invalid_argument(m),
            Error::NotFound(m) => Status::not_found(m),
            Error::FailedPrecondition(m) => Status::failed_precondition(m),
            Error::NodeDown(m) => with_reason(Code::FailedPrecondition, m, REASON_NODE_DOWN),
            Error::NoCapacity(m) => with_reason(Code::ResourceExhausted, m, REASON_NO_CAPACITY),
            Error::Quota(m) => with_reason(Code::ResourceExhausted, m, REASON_QUOTA),
            Error::Bound { message, bound } => {
                let mut status = with_reason(Code::ResourceExhausted, message, REASON_QUOTA);
                if let Ok(v) = bound.parse() {
                    status.metadata_mut().insert(BOUND_METADATA, v);
                }
                status
            }
            Error::AlreadyExists(m) => Status::already_exists(m),
            Error::Aborted(m) => Status::aborted(m),
            Error::Refused { message, reason } => {
                with_reason(Code::FailedPrecondition, message, reason)
            }
            Error::PermissionDenied(m) => Status::permission_denied(m),
            Error::Unauthenticated(m) => Status::unauthenticated(m),
            Error::Store(e) => {
                tracing::warn!(error = %e, "store failure");
                Status::unavailable(format!("store unavailable: {e}"))
            }
            Error::Corrupt(m) => {
                tracing::error!(problem = %m, "corrupt stored data");
                Status::internal(format!("corrupt stored data: {m}"))
            }
            Error::Internal(m) => {
                tracing::error!(problem = %m, "store operation failed");
                Status::internal(format!("store operation failed: {m}"))
            }
        }
    }
}

/// `Result` with the scheduler's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
