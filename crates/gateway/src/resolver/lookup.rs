//! The scheduler as a [`RouteSource`]: `LookupNode`, and concurrent misses
//! batched into `LookupNodes`.
//!
//! A miss is queued for one dispatcher task. The dispatcher takes the
//! first queued miss, waits for one of [`IN_FLIGHT`] call slots, and sends
//! with it every miss queued meanwhile (up to [`MAX_BATCH`]). A miss alone
//! goes out at once as a `LookupNode`, as it always did; misses that
//! arrive while the scheduler is busy answering others share one call, so
//! a cold gateway in front of many busy sandboxes asks in batches exactly
//! when it asks most. No miss waits on a timer. A scheduler that does not
//! know `LookupNodes` (an older one, mid-upgrade) is asked one id at a time.
//!
//! Every lookup names the last `WatchBindings` revision this gateway has
//! applied (`min_revision`): the scheduler's answer is never older than a
//! change this gateway has already acted on. A consistent lookup (after a
//! node proved a route wrong) is never batched and reads the scheduler's
//! store.

use super::{ResolveError, Route, RouteSource};
use crate::metrics::Metrics;
use futures_util::future::BoxFuture;
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tonic::{Code, Status};
use warren_proto::client::Scheduler;
use warren_proto::scheduler::v1::{
    BindingState, LookupNodeRequest, LookupNodesRequest, LookupResult, Route as PbRoute,
};
use warren_proto::REASON_METADATA;

/// Lookup calls in flight at once; misses queue behind them and go out
/// together in the next call.
pub const IN_FLIGHT: usize = 4;
/// Most ids in one `LookupNodes` (the scheduler takes up to 1024).
pub const MAX_BATCH: usize = 256;
/// Misses queued for the dispatcher before callers wait to queue.
const QUEUE: usize = 4096;

/// One miss waiting for its answer.
struct Ask {
    sandbox_id: String,
    reply: oneshot::Sender<Result<Route, ResolveError>>,
}

/// `LookupNode` on the scheduler, counted in
/// `warren_gateway_scheduler_lookups_total` (one per id) and
/// `warren_gateway_scheduler_lookup_calls_total` (one per call).
pub struct LookupNode {
    scheduler: Arc<Scheduler>,
    metrics: Metrics,
    /// The dispatcher's queue, started on first use (on the runtime that
    /// serves the lookups).
    queue: OnceLock<mpsc::Sender<Ask>>,
}

impl LookupNode {
    /// Lookups against `scheduler`, counted in `metrics`.
    pub fn new(scheduler: Arc<Scheduler>, metrics: Metrics) -> Self {
        LookupNode {
            scheduler,
            metrics,
            queue: OnceLock::new(),
        }
    }

    fn queue(&self) -> &mpsc::Sender<Ask> {
        self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(dispatch(self.scheduler.clone(), self.metrics.clone(), rx));
            tx
        })
    }

    async fn batched(&self, sandbox_id: &str) -> Result<Route, ResolveError> {
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            sandbox_id: sandbox_id.to_string(),
            reply,
        };
        if self.queue().send(ask).await.is_err() {
            return one(&self.scheduler, &self.metrics, sandbox_id, false).await;
        }
        answer.await.unwrap_or_else(|_| {
            Err(ResolveError {
                sandbox_id: sandbox_id.to_string(),
                status: Status::unavailable("the gateway's lookup dispatcher stopped"),
            })
        })
    }
}

impl RouteSource for LookupNode {
    fn lookup<'a>(&'a self, sandbox_id: &'a str) -> BoxFuture<'a, Result<Route, ResolveError>> {
        Box::pin(self.batched(sandbox_id))
    }

    fn lookup_consistent<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Route, ResolveError>> {
        Box::pin(one(&self.scheduler, &self.metrics, sandbox_id, true))
    }
}

/// Sends queued misses, a batch per free call slot.
async fn dispatch(scheduler: Arc<Scheduler>, metrics: Metrics, mut queue: mpsc::Receiver<Ask>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(ask) => batch.push(ask),
                Err(_) => break,
            }
        }
        let (scheduler, metrics) = (scheduler.clone(), metrics.clone());
        tokio::spawn(async move {
            answer(&scheduler, &metrics, batch).await;
            drop(slot);
        });
    }
}

/// Answers every ask of `batch`: one `LookupNode` for a single id, one
/// `LookupNodes` for more.
async fn answer(scheduler: &Scheduler, metrics: &Metrics, batch: Vec<Ask>) {
    // Callers that went away (their client did) need no answer.
    let mut batch: Vec<Ask> = batch.into_iter().filter(|a| !a.reply.is_closed()).collect();
    if batch.len() <= 1 {
        if let Some(ask) = batch.pop() {
            let r = one(scheduler, metrics, &ask.sandbox_id, false).await;
            let _ = ask.reply.send(r);
        }
        return;
    }
    metrics.scheduler_lookups.inc_by(batch.len() as u64);
    metrics.scheduler_lookup_calls.inc();
    let min_revision = watch_revision(metrics);
    let ids: Vec<String> = batch.iter().map(|a| a.sandbox_id.clone()).collect();
    let answered = scheduler
        .call("LookupNodes", |mut c| {
            let sandbox_ids = ids.clone();
            async move {
                c.lookup_nodes(LookupNodesRequest {
                    sandbox_ids,
                    min_revision,
                })
                .await
            }
        })
        .await;
    match answered {
        Ok(r) if r.results.len() == batch.len() => {
            for (ask, result) in batch.into_iter().zip(r.results) {
                let _ = ask.reply.send(route_of(&ask.sandbox_id, result));
            }
        }
        Ok(r) => {
            let status = Status::internal(format!(
                "the scheduler answered {} results for {} sandbox ids",
                r.results.len(),
                batch.len()
            ));
            fail_all(batch, &status);
        }
        Err(status) if status.code() == Code::Unimplemented => {
            // An older scheduler: one call per id, all at once.
            let each = batch.into_iter().map(|ask| async move {
                let r = one(scheduler, metrics, &ask.sandbox_id, false).await;
                let _ = ask.reply.send(r);
            });
            futures_util::future::join_all(each).await;
        }
        Err(status) => fail_all(batch, &status),
    }
}

fn fail_all(batch: Vec<Ask>, status: &Status) {
    for ask in batch {
        let _ = ask.reply.send(Err(ResolveError {
            sandbox_id: ask.sandbox_id,
            status: status.clone(),
        }));
    }
}

/// One `LookupNode`: answered at least as new as the watch revision this
/// gateway has applied, from the scheduler's store when `consistent`.
async fn one(
    scheduler: &Scheduler,
    metrics: &Metrics,
    sandbox_id: &str,
    consistent: bool,
) -> Result<Route, ResolveError> {
    metrics.scheduler_lookups.inc();
    metrics.scheduler_lookup_calls.inc();
    let min_revision = watch_revision(metrics);
    scheduler
        .call("LookupNode", |mut c| async move {
            c.lookup_node(LookupNodeRequest {
                sandbox_id: sandbox_id.to_string(),
                min_revision,
                consistent,
            })
            .await
        })
        .await
        .map(route)
        .map_err(|status| ResolveError {
            sandbox_id: sandbox_id.to_string(),
            status,
        })
}

/// The last `WatchBindings` revision this gateway applied (0: none yet).
fn watch_revision(metrics: &Metrics) -> u64 {
    u64::try_from(metrics.watch_revision.get()).unwrap_or(0)
}

fn route(r: PbRoute) -> Route {
    Route {
        sandbox_id: r.sandbox_id,
        node_id: r.node_id,
        endpoint: r.endpoint,
        generation: r.generation,
        state: BindingState::try_from(r.state).unwrap_or(BindingState::Unspecified),
        team_id: r.team_id,
        auto_resume: r.auto_resume,
    }
}

/// One id's result of a `LookupNodes`, as its own `LookupNode` would have
/// answered (the same status code, message and reason metadata).
fn route_of(sandbox_id: &str, result: LookupResult) -> Result<Route, ResolveError> {
    if let Some(r) = result.route {
        return Ok(route(r));
    }
    let code = match Code::from_i32(result.code) {
        Code::Ok => Code::Internal,
        code => code,
    };
    let mut status = Status::new(code, result.message);
    if !result.reason.is_empty() {
        if let Ok(v) = result.reason.parse() {
            status.metadata_mut().insert(REASON_METADATA, v);
        }
    }
    Err(ResolveError {
        sandbox_id: sandbox_id.to_string(),
        status,
    })
}
