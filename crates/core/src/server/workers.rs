//! Worker threads that own connections: each runs a single-threaded Tokio
//! runtime, and every connection handed to it, with every task it spawns
//! (a pooled client connection, a WebSocket splice), runs there until it
//! ends.
//!
//! Why: on Tokio's work-stealing runtime the tasks of one proxied request
//! (the client's connection, the upstream connection, their channels)
//! wake each other across threads, and idle workers park and are unparked
//! for every hop. Measured on the gateway (`bench/gateway.sh`), that was
//! about two context switches per request and most of the gap to nginx.
//! A worker that owns its connections wakes only itself, and blocks in
//! `epoll_wait` only when it has nothing to do, the way nginx's worker
//! processes do.
//!
//! The accept loop stays where it was and hands each connection to the
//! worker with the fewest open ones ([`Workers::spawn`]); the connection
//! is re-registered with that worker's reactor
//! ([`Accept::rehome`](super::Accept::rehome)) before its first byte is
//! read. A handler can ask which worker it runs on ([`Workers::index_here`])
//! to use state of that worker's own, such as a connection pool.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A connection's task, to run on a worker.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Tells worker sets apart (several servers may run in one process, as in
/// tests).
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// On a worker thread: (its set's id, its index in the set).
    static HERE: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// A set of worker threads. Cheap to clone; the threads stop once the
/// last clone is dropped (their connections are cancelled then, so drop
/// it only after the server that uses it has drained).
#[derive(Clone)]
pub struct Workers {
    inner: Arc<Inner>,
}

struct Inner {
    id: usize,
    workers: Vec<Worker>,
}

struct Worker {
    /// Jobs for this worker's runtime; closing it ends the thread.
    jobs: mpsc::UnboundedSender<Job>,
    /// Connections open on it now: where the next one goes.
    open: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.inner.workers.len())
            .finish()
    }
}

impl Workers {
    /// Starts `threads` (at least one) worker threads named `{name}-{i}`.
    pub fn start(threads: usize, name: &str) -> std::io::Result<Workers> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let mut workers = Vec::with_capacity(threads.max(1));
        for index in 0..threads.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || {
                    HERE.with(|h| h.set(Some((id, index))));
                    runtime.block_on(async move {
                        while let Some(job) = queue.recv().await {
                            tokio::spawn(job);
                        }
                    });
                    // Dropping the runtime cancels what is still running
                    // on it (idle pooled connections).
                })?;
            workers.push(Worker {
                jobs,
                open: Arc::new(AtomicUsize::new(0)),
            });
        }
        Ok(Workers {
            inner: Arc::new(Inner { id, workers }),
        })
    }

    /// How many worker threads there are.
    pub fn len(&self) -> usize {
        self.inner.workers.len()
    }

    /// Always false: a set has at least one worker.
    pub fn is_empty(&self) -> bool {
        self.inner.workers.is_empty()
    }

    /// The index of the worker of this set the caller runs on, if any.
    pub fn index_here(&self) -> Option<usize> {
        match HERE.with(Cell::get) {
            Some((id, index)) if id == self.inner.id => Some(index),
            _ => None,
        }
    }

    /// Runs a connection's task on the worker with the fewest open
    /// connections; it counts as open there until it ends.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let Some(worker) = self
            .inner
            .workers
            .iter()
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
        else {
            return;
        };
        let open = Open::new(worker.open.clone());
        let job = Box::pin(async move {
            let _open = open;
            task.await;
        });
        // Fails only once the worker's thread has ended, i.e. never while
        // a server still holds this set; the connection is then dropped.
        let _ = worker.jobs.send(job);
    }
}

/// Counts a connection as open on its worker until dropped (also when the
/// worker's runtime cancels it).
struct Open(Arc<AtomicUsize>);

impl Open {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Open(count)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn connections_spread_and_know_their_worker() {
        let workers = Workers::start(2, "test-worker").expect("workers");
        assert_eq!(workers.len(), 2);
        assert_eq!(
            workers.index_here(),
            None,
            "the test's own thread is no worker"
        );
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (release, hold) = tokio::sync::watch::channel(false);
        // Four long connections: two on each worker, since each goes to
        // the one with fewer open.
        for _ in 0..4 {
            let (tx, w, mut hold) = (tx.clone(), workers.clone(), hold.clone());
            workers.spawn(async move {
                let _ = tx.send(w.index_here());
                let _ = hold.wait_for(|go| *go).await;
            });
        }
        let mut seen = Vec::new();
        for _ in 0..4 {
            let index = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a worker ran the task");
            seen.push(index.flatten().expect("it knows its index"));
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 0, 1, 1]);
        // Another set's threads are not this set's workers.
        let other = Workers::start(1, "test-other").expect("workers");
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        let w = workers.clone();
        other.spawn(async move {
            let _ = tx2.send(w.index_here());
        });
        let index = tokio::time::timeout(Duration::from_secs(10), rx2.recv())
            .await
            .expect("ran");
        assert_eq!(index, Some(None));
        let _ = release.send(true);
    }
}
