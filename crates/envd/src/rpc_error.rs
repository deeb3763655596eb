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
        ProcError::User(_) => ConnectError::invalid_argument(e.to_string()),
        ProcError::Spawn { ref source, .. } => {
            let code = match source.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => {
                    ErrorCode::InvalidArgument
                }
                _ => ErrorCode::Internal,
            };
            ConnectError::new(code, e.to_string())
        }
        ProcError::StdinClosed(_) => ConnectError::failed_precondition(e.to_string()),
        ProcError::StdinWrite { .. } => ConnectError::failed_precondition(e.to_string()),
        ProcError::Signal { .. } => ConnectError::internal(e.to_string()),
    }
}

/// The Connect code for a filesystem error on `what` (a client path).
pub fn io_error(what: &str, e: io::Error) -> ConnectError {
    let code = io_code(&e);
    let message = match e.kind() {
        io::ErrorKind::NotFound => format!("path {what:?} does not exist"),
        io::ErrorKind::AlreadyExists => format!("path {what:?} already exists"),
        _ => format!("{what}: {e}"),
    };
    ConnectError::new(code, message)
}

fn io_code(e: &io::Error) -> ErrorCode {
    match e.kind() {
        io::ErrorKind::NotFound => ErrorCode::NotFound,
        io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        io::ErrorKind::InvalidInput => ErrorCode::InvalidArgument,
        _ => match e.raw_os_error() {
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
