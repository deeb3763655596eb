//! The scheduler gRPC client, with failover across the configured replicas.
//!
//! Channels connect lazily, so a gateway starts even while its schedulers
//! are still coming up. A call goes to the replica that answered last; on a
//! transport failure (`UNAVAILABLE`/`UNKNOWN`, or no answer within the
//! request timeout) it moves on to the next replica, once around the list.
//! Every RPC the gateway makes is safe to repeat: `Place` always carries an
//! idempotency key, and the rest are reads or fenced writes.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use warren_core::config::ConfigError;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;

/// The scheduler client used for every RPC.
pub type Client = SchedulerClient<Channel>;

/// Scheduler replicas in failover order.
pub struct Scheduler {
    /// (URL, client) per replica.
    replicas: Vec<(String, Client)>,
    /// Index of the replica to try first.
    current: AtomicUsize,
    /// Deadline per attempt.
    timeout: Duration,
}

impl Scheduler {
    /// Lazily connecting clients for `urls` (validated by the config).
    pub fn new(
        urls: &[String],
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let mut replicas = Vec::with_capacity(urls.len());
        for url in urls {
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| ConfigError::Invalid(format!("--scheduler {url:?}: {e}")))?
                .connect_timeout(connect_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_while_idle(true);
            replicas.push((url.clone(), SchedulerClient::new(endpoint.connect_lazy())));
        }
        if replicas.is_empty() {
            return Err(ConfigError::Invalid("no scheduler configured".into()));
        }
        Ok(Scheduler {
            replicas,
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

    /// Runs `rpc` against the current replica, failing over on transport errors.
    pub async fn call<T, F, Fut>(&self, name: &'static str, rpc: F) -> Result<T, Status>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let n = self.replicas.len();
        let start = self.current.load(Ordering::Relaxed) % n;
        let mut last = Status::unavailable("no scheduler replica answered");
        for i in 0..n {
            let idx = (start + i) % n;
            let (url, client) = &self.replicas[idx];
            let outcome = tokio::time::timeout(self.timeout, rpc(client.clone())).await;
            match outcome {
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

/// Whether another replica may do better: the call did not reach a working
/// scheduler (transport errors surface as `UNAVAILABLE` or `UNKNOWN`).
fn fails_over(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::Unknown)
}
