//! E2B envd's Connect-RPC API, as the `e2b` SDK speaks it.
//!
//! # Layout
//! - `process`: `process.Process` (Start, Connect, List, SendInput, ...).
//!   warren adds one field the E2B SDK never sends:
//!   `ConnectRequest.offset` (field 100), the byte offset into the process's
//!   output (stdout and stderr bytes counted together, in the order they were
//!   produced) from which a reattaching client wants to resume.
//! - `filesystem`: `filesystem.Filesystem` (Stat, ListDir, MakeDir, ...).
//!
//! Both are generated from `proto/` at build time by `connectrpc-build`.
#![allow(clippy::all, missing_docs, rust_2018_idioms)]

connectrpc::include_generated!();
