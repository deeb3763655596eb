//! Mutual TLS between warren's parts (docs/security.md, "Internal trust").
//!
//! One cluster CA signs a certificate for every part. A certificate names
//! its holder's **role** and **name** in a URI subject alternative name,
//! `warren://<role>/<name>` (`warren://node/node-1`,
//! `warren://gateway/gw-a`, `warren://scheduler/s1`), plus the DNS names and
//! IP addresses it serves on. Who may talk to whom:
//!
//! | listener | accepts client certificates of |
//! |---|---|
//! | scheduler gRPC | nodes (node RPCs, as the node their certificate names) and gateways (everything else) |
//! | node control API + data plane | gateways |
//!
//! and every client checks that the server it reached holds the role it
//! meant to reach (a gateway dialing a node wants a node certificate for
//! that address). Refusals — no certificate, an unknown CA, an expired
//! certificate, the wrong role — fail the handshake and are logged by the
//! refusing side with the peer's address and the reason.
//!
//! - [`identity`]: roles, names and reading them off a certificate.
//! - [`issue`]: the CA and certificates (`warren certs`, `warren dev`).
//! - [`config`]: the `--tls-*` / `--insecure-internal` flags every part
//!   shares and the loaded [`Trust`].
//! - [`listen`]: a TLS listener that handshakes concurrently and hands out
//!   authenticated connections (for the shared HTTP server loop and tonic).
//! - [`connect`]: TLS connectors for the hyper client and tonic channels.
//! - [`public`]: the gateway's public TLS (a certificate from files, no
//!   client authentication, ALPN h2 and http/1.1), re-read on change too.
//! - [`sandbox_ca`]: a sandbox's egress CA (made by the scheduler, used by
//!   the node's egress proxy) and the leaves it signs.

pub mod config;
pub mod connect;
pub mod identity;
pub mod issue;
pub mod listen;
pub mod public;
pub mod sandbox_ca;

pub use config::{TlsArgs, Trust};
pub use identity::{Identity, Role};
pub use listen::{Listener, Peer};
