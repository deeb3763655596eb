//! Headers warren puts on the wire between its parts.
//!
//! The gateway strips every client-sent header starting with `x-warren-`
//! before it adds its own, so a client cannot spoof them.

/// Gateway → node: which sandbox the request is for.
pub const SANDBOX_ID: &str = "x-warren-sandbox-id";
/// Gateway → node: which port inside the sandbox.
pub const SANDBOX_PORT: &str = "x-warren-sandbox-port";
/// Gateway → node: the binding generation the gateway routed by.
pub const GENERATION: &str = "x-warren-generation";
/// Node → gateway: `not-found` when the node does not host that sandbox at
/// that generation (the one reliable stale-route signal).
pub const ROUTE: &str = "x-warren-route";
/// Value of [`ROUTE`] for a stale route.
pub const ROUTE_NOT_FOUND: &str = "not-found";
/// Prefix of every warren-internal header.
pub const INTERNAL_PREFIX: &str = "x-warren-";

/// E2B SDK → gateway: sandbox id when `E2B_SANDBOX_URL` is used.
pub const E2B_SANDBOX_ID: &str = "e2b-sandbox-id";
/// E2B SDK → gateway: sandbox port when `E2B_SANDBOX_URL` is used.
pub const E2B_SANDBOX_PORT: &str = "e2b-sandbox-port";
/// envd's access token header.
pub const ACCESS_TOKEN: &str = "x-access-token";
/// Control-plane API key header.
pub const API_KEY: &str = "x-api-key";
/// Idempotency key header for creates.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The port envd serves its API on, as in E2B.
pub const ENVD_PORT: u16 = 49983;
