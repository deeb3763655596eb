//! How envd's errors become Connect errors (RPCs) and HTTP statuses (`/files`).
//!
//! The e2b SDK branches on a few codes: `not_found` (missing file or process),
//! `already_exists` (MakeDir), `invalid_argument`, `permission_denied`.

use crate::paths::PathError;
use crate::process::manager::ProcError;
use connectrpc::{ConnectError, ErrorCode};
use std::io;

/// The Connect code for a path resolution failure.
pub fn path_error(e: PathError) -> ConnectError {
    let code = match &e {
        PathError::Escape(_) | PathError::Nul(_) | PathError::Loop(_) => ErrorCode::InvalidArgument,
        PathError::SymlinkEscape(_) => ErrorCode::PermissionDenied,
        PathError::Io { source, .. } => io_code(source),
    };
    ConnectError::new(code, e.to_string())
}

/// The Connect code for a process request failure.
pub fn proc_error(e: ProcError) -> ConnectError {
    match e {
        ProcError::Path(p) => path_error(p),
        ProcError::NotFound(_) => ConnectError::not_found(e.to_string()),
        ProcError::Cwd(_) => ConnectError::invalid_argument(e.to_string()),
        ProcError::User(_) | ProcError::Invalid(_) => ConnectError::invalid_argument(e.to_string()),
        ProcError::Spawn {
            ref cmd,
            ref source,
        } => {
            if source.raw_os_error() == Some(libc::E2BIG) {
                return ConnectError::invalid_argument(format!(
                    "cannot start {cmd:?}: its arguments and environment (the sandbox's \
                     envVars included) are too large together for the kernel (E2BIG); \
                     each NAME=value or argument may have at most {} bytes, and all of \
                     them together about a quarter of the stack limit (2 MiB by default)",
                    warren_core::env::MAX_VAR_BYTES
                ));
            }
            let code = match source.kind() {
                io::ErrorKind::NotFound
                | io::ErrorKind::PermissionDenied
                | io::ErrorKind::InvalidInput => ErrorCode::InvalidArgument,
                _ => ErrorCode::Internal,
            };
            ConnectError::new(code, e.to_string())
        }
        ProcError::StdinClosed(_) | ProcError::Pty(_) => {
            ConnectError::failed_precondition(e.to_string())
        }
        ProcError::StdinWrite { .. } => ConnectError::failed_precondition(e.to_string()),
        ProcError::Signal { .. } => ConnectError::internal(e.to_string()),
    }
}

/// The Connect code for a filesystem error on `what` (a client path).
pub fn io_error(what: &str, e: io::Error) -> ConnectError {
    let code = io_code(&e);
    let message = match (e.kind(), e.raw_os_error()) {
        (io::ErrorKind::NotFound, _) => format!("path {what:?} does not exist"),
        (io::ErrorKind::AlreadyExists, _) => format!("path {what:?} already exists"),
        (_, Some(libc::EROFS)) => {
            format!("{what}: read-only file system: this path cannot be written ({e})")
        }
        (_, Some(libc::EBUSY)) => {
            format!("{what}: busy (a mount point, or in use), so it cannot be changed ({e})")
        }
        (_, Some(libc::ETXTBSY)) => {
            format!("{what}: a program that is running, so it cannot be written ({e})")
        }
        _ => format!("{what}: {e}"),
    };
    ConnectError::new(code, message)
}

/// Every error a request can cause (a path that is read-only, busy, of the
/// wrong kind, full) is the client's: a 4xx (507 for a full disk, as E2B).
/// Only what is left is `internal`.
fn io_code(e: &io::Error) -> ErrorCode {
    match e.kind() {
        io::ErrorKind::NotFound => ErrorCode::NotFound,
        io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        io::ErrorKind::InvalidInput => ErrorCode::InvalidArgument,
        _ => match e.raw_os_error() {
            // Read-only is "you may not write here", as EACCES and EPERM are.
            Some(libc::EROFS) => ErrorCode::PermissionDenied,
            Some(libc::EBUSY) | Some(libc::ETXTBSY) => ErrorCode::FailedPrecondition,
            Some(libc::ENOTDIR)
            | Some(libc::EISDIR)
            | Some(libc::ENOTEMPTY)
            | Some(libc::EXDEV)
            | Some(libc::ENAMETOOLONG)
            | Some(libc::ELOOP) => ErrorCode::InvalidArgument,
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorCode::ResourceExhausted,
            _ => ErrorCode::Internal,
        },
    }
}

/// The HTTP status for a Connect code (for `/files`, which speaks plain JSON).
pub fn http_status(code: ErrorCode) -> http::StatusCode {
    use http::StatusCode as S;
    match code {
        ErrorCode::InvalidArgument | ErrorCode::OutOfRange | ErrorCode::FailedPrecondition => {
            S::BAD_REQUEST
        }
        ErrorCode::Unauthenticated => S::UNAUTHORIZED,
        ErrorCode::PermissionDenied => S::FORBIDDEN,
        ErrorCode::NotFound => S::NOT_FOUND,
        ErrorCode::AlreadyExists => S::CONFLICT,
        // E2B's envd answers 507 when the disk is full.
        ErrorCode::ResourceExhausted => S::INSUFFICIENT_STORAGE,
        _ => S::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_request_did_wrong_is_never_internal() {
        let code = |errno| io_error("/p", io::Error::from_raw_os_error(errno)).code;
        assert_eq!(code(libc::EROFS), ErrorCode::PermissionDenied);
        assert_eq!(code(libc::EACCES), ErrorCode::PermissionDenied);
        assert_eq!(code(libc::EPERM), ErrorCode::PermissionDenied);
        assert_eq!(code(libc::EBUSY), ErrorCode::FailedPrecondition);
        assert_eq!(code(libc::ETXTBSY), ErrorCode::FailedPrecondition);
        assert_eq!(code(libc::ENOSPC), ErrorCode::ResourceExhausted);
        assert_eq!(http_status(code(libc::EROFS)), http::StatusCode::FORBIDDEN);
        let message = io_error("/opt/x", io::Error::from_raw_os_error(libc::EROFS))
            .message
            .unwrap_or_default();
        assert!(
            message.contains("/opt/x") && message.contains("read-only"),
            "{message}"
        );
    }
}
