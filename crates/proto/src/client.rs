//! The one scheduler client gateways and nodes share: which `--scheduler`
//! values are accepted, how calls fail over between replicas, and with
//! which timeouts.
//!
//! - **Syntax** ([`parse_urls`]): a comma-separated list (the flag may also
//!   be repeated) of `host:port`, `http://host[:port]` or `https://...`.
//!   With internal TLS (`--tls-*`, warren_trust) every replica is dialed
//!   with mutual TLS whatever the scheme says, and must present a scheduler
//!   certificate valid for the host; under `--insecure-internal` an
//!   `https://` URL is refused when the configuration is read.
//! - **Failover** ([`fails_over`]): a call goes to the replica that answered
//!   last; when it did not reach a working scheduler (`UNAVAILABLE`,
//!   `UNKNOWN`, `DEADLINE_EXCEEDED`, `CANCELLED`, or no answer within the
//!   per-call timeout) it moves on to the next replica, once around the list.
//!   Every RPC gateways and nodes make is safe to repeat: `Place` carries an
//!   idempotency key, the rest are reads, fenced writes or idempotent reports.
//! - **Channels** connect lazily, so a part starts while its schedulers are
//!   still coming up, and keep HTTP/2 pings going so a dead peer is noticed.
//!
//! Pauses between whole rounds belong to the caller, with
//! `warren_core::backoff::Backoff`.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::scheduler::v1::scheduler_client::SchedulerClient;
use crate::scheduler::v1::secrets_client::SecretsClient;

/// The generated client over one replica's channel.
pub type Client = SchedulerClient<Channel>;
/// The `Secrets` service's client over the same channel.
pub type Secrets = SecretsClient<Channel>;

/// Default TCP connect timeout towards a scheduler.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default deadline for one call to one replica.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A `--scheduler` value that is not a scheduler URL.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("at least one scheduler URL is required")]
    Empty,
    #[error("{0:?} is not a URL: {1}")]
    Invalid(String, String),
    #[error(
        "{0:?}: https:// needs internal TLS (--tls-ca, --tls-cert, --tls-key), \
         but --insecure-internal is set; use http://host:port"
    )]
    Tls(String),
    #[error("internal TLS: {0}")]
    TlsConfig(String),
    #[error("{0:?} must be host:port or http://host:port")]
    Shape(String),
}

/// Parses `--scheduler` values (each may be a comma-separated list) into
/// `http://host:port` URLs; see the module doc.
pub fn parse_urls<S: AsRef<str>>(values: &[S]) -> Result<Vec<String>, UrlError> {
    let mut urls = Vec::new();
    for raw in values
        .iter()
        .flat_map(|v| v.as_ref().split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let url = if raw.contains("://") {
            raw.to_string()
        } else {
            format!("http://{raw}")
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| UrlError::Invalid(raw.into(), e.to_string()))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(UrlError::Shape(raw.into())),
        }
        let path_ok = matches!(uri.path(), "" | "/") && uri.query().is_none();
        if uri.host().is_none() || !path_ok {
            return Err(UrlError::Shape(raw.into()));
        }
        urls.push(url.trim_end_matches('/').to_string());
    }
    if urls.is_empty() {
        return Err(UrlError::Empty);
    }
    Ok(urls)
}

/// Whether another replica may do better: the call did not reach a working
/// scheduler. Anything else is the scheduler's answer and is final.
pub fn fails_over(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled
    )
}

/// Scheduler replicas in failover order.
pub struct Scheduler {
    /// (URL, client) per replica, in `--scheduler` order.
    replicas: Vec<(String, Client)>,
    /// The same replicas' channels, for the `Secrets` service.
    channels: Vec<Channel>,
    /// Index of the replica that answered last: tried first.
    current: AtomicUsize,
    /// Deadline per call per replica.
    timeout: Duration,
}

impl Scheduler {
    /// Lazily connecting clients for `urls` (from [`parse_urls`]), with
    /// mutual TLS when `trust` is given (`None`: `--insecure-internal`).
    pub fn new(
        urls: &[String],
        connect_timeout: Duration,
        timeout: Duration,
        trust: Option<&warren_trust::Trust>,
    ) -> Result<Self, UrlError> {
        let mut replicas = Vec::with_capacity(urls.len());
        for url in urls {
            let dialed = match (trust, url.strip_prefix("http://")) {
                (Some(_), Some(rest)) => format!("https://{rest}"),
                (None, None) => return Err(UrlError::Tls(url.clone())),
                _ => url.clone(),
            };
            let endpoint = endpoint(url, dialed, connect_timeout)?;
            let channel = match trust {
                None => endpoint.connect_lazy(),
                Some(t) => {
                    let connector = warren_trust::connect::connector(
                        Some(t),
                        warren_trust::Role::Scheduler,
                        connect_timeout,
                        warren_trust::connect::DEAD_PEER_TIMEOUT,
                        true,
                    )
                    .map_err(UrlError::TlsConfig)?;
                    endpoint.connect_with_connector_lazy(connector)
                }
            };
            replicas.push((url.clone(), channel));
        }
        Self::of(replicas, timeout)
    }

    /// The same over connections `connector` makes (plain HTTP/2, no TLS):
    /// how the deterministic simulation (`crates/sim`) dials schedulers
    /// over its simulated network. Production parts use [`Scheduler::new`].
    pub fn with_connector<C>(
        urls: &[String],
        connect_timeout: Duration,
        timeout: Duration,
        connector: C,
    ) -> Result<Self, UrlError>
    where
        C: tonic::codegen::Service<http::Uri> + Clone + Send + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
        C::Future: Send,
        tonic::codegen::StdError: From<C::Error> + Send,
    {
        let mut replicas = Vec::with_capacity(urls.len());
        for url in urls {
            let channel = endpoint(url, url.clone(), connect_timeout)?
                .connect_with_connector_lazy(connector.clone());
            replicas.push((url.clone(), channel));
        }
        Self::of(replicas, timeout)
    }

    /// One client per replica's channel (and the channel itself, for the
    /// `Secrets` service).
    fn of(replicas: Vec<(String, Channel)>, timeout: Duration) -> Result<Self, UrlError> {
        if replicas.is_empty() {
            return Err(UrlError::Empty);
        }
        let channels = replicas.iter().map(|(_, c)| c.clone()).collect();
        let replicas = replicas
            .into_iter()
            .map(|(url, c)| (url, SchedulerClient::new(c)))
            .collect();
        Ok(Scheduler {
            replicas,
            channels,
            current: AtomicUsize::new(0),
            timeout,
        })
    }

    /// The replica `attempt` steps after the current one, for long-lived
    /// streams that pick their own replica on every reconnect.
    pub fn replica(&self, attempt: usize) -> (&str, Client) {
        let n = self.replicas.len();
        let idx = (self.current.load(Ordering::Relaxed) + attempt) % n;
        let (url, client) = &self.replicas[idx];
        (url.as_str(), client.clone())
    }

    /// Runs `rpc` against the current replica, failing over as the module
    /// doc says.
    pub async fn call<T, F, Fut>(&self, name: &'static str, rpc: F) -> Result<T, Status>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_on(name, |idx| rpc(self.replicas[idx].1.clone()))
            .await
    }

    /// [`Scheduler::call`] for the `Secrets` service.
    pub async fn call_secrets<T, F, Fut>(&self, name: &'static str, rpc: F) -> Result<T, Status>
    where
        F: Fn(Secrets) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_on(name, |idx| {
            rpc(SecretsClient::new(self.channels[idx].clone()))
        })
        .await
    }

    async fn call_on<T, F, Fut>(&self, name: &'static str, rpc: F) -> Result<T, Status>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let n = self.replicas.len();
        let start = self.current.load(Ordering::Relaxed) % n;
        let mut last = Status::unavailable("no scheduler replica answered");
        for i in 0..n {
            let idx = (start + i) % n;
            let url = &self.replicas[idx].0;
            match tokio::time::timeout(self.timeout, rpc(idx)).await {
                Ok(Ok(resp)) => {
                    if idx != start {
                        self.current.store(idx, Ordering::Relaxed);
                    }
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) if fails_over(&status) => {
                    tracing::warn!(rpc = name, scheduler = %url, code = ?status.code(),
                        message = status.message(), "scheduler call failed; trying the next replica");
                    last = status;
                }
                Ok(Err(status)) => return Err(status),
                Err(_) => {
                    tracing::warn!(rpc = name, scheduler = %url, timeout = ?self.timeout,
                        "scheduler call timed out; trying the next replica");
                    last = Status::unavailable(format!(
                        "{name} to {url} timed out after {:?}",
                        self.timeout
                    ));
                }
            }
        }
        Err(last)
    }
}

/// One replica's endpoint: connect timeout, no Nagle, HTTP/2 pings so a
/// dead peer is noticed.
fn endpoint(url: &str, dialed: String, connect_timeout: Duration) -> Result<Endpoint, UrlError> {
    Ok(Endpoint::from_shared(dialed)
        .map_err(|e| UrlError::Invalid(url.to_string(), e.to_string()))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_http_urls_are_one_syntax() {
        let urls = parse_urls(&["127.0.0.1:1, http://a:2/", "b:3"]).expect("valid");
        assert_eq!(urls, ["http://127.0.0.1:1", "http://a:2", "http://b:3"]);
    }

    #[test]
    fn what_cannot_work_is_refused_up_front() {
        for bad in ["ftp://a:1", "http://", "a:1/path", " , "] {
            assert!(parse_urls(&[bad]).is_err(), "{bad} accepted");
        }
        let urls = parse_urls(&["https://a:1"]).expect("https is a URL");
        let err = Scheduler::new(&urls, CALL_TIMEOUT, CALL_TIMEOUT, None)
            .err()
            .expect("https without TLS");
        assert!(err.to_string().contains("TLS"), "{err}");
    }

    #[test]
    fn transport_failures_fail_over_and_answers_do_not() {
        assert!(fails_over(&Status::unavailable("x")));
        assert!(fails_over(&Status::deadline_exceeded("x")));
        assert!(!fails_over(&Status::not_found("x")));
        assert!(!fails_over(&Status::failed_precondition("x")));
    }
}
