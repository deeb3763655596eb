//! Where a server is in its life (serving, draining, closing), told to
//! every connection task.
//!
//! Each connection's task checks it whenever it runs, i.e. for every read,
//! write and answer of every request, so checking costs two atomics and
//! no lock (a `tokio::sync::watch` takes one per check); only a change,
//! which happens twice in a server's life, walks every connection.

use futures_util::task::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

/// Where the server is in its life; every connection task follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Serving,
    /// Finish what is in flight, take nothing new (HTTP/2 GOAWAY, HTTP/1.1
    /// `Connection: close`).
    Draining,
    /// The drain timed out: close now.
    Closing,
}

impl Stage {
    fn from_u8(v: u8) -> Stage {
        match v {
            0 => Stage::Serving,
            1 => Stage::Draining,
            _ => Stage::Closing,
        }
    }
}

/// The server's stage and the connections to wake when it changes.
#[derive(Default)]
pub(crate) struct Stages {
    stage: AtomicU8,
    watchers: Mutex<Watchers>,
}

#[derive(Default)]
struct Watchers {
    list: Vec<Weak<AtomicWaker>>,
    /// Prune dead entries when the list reaches this length.
    prune_at: usize,
}

impl Stages {
    /// Moves every connection to `stage`.
    pub(crate) fn set(&self, stage: Stage) {
        self.stage.store(stage as u8, Ordering::Release);
        let watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        for w in watchers.list.iter().filter_map(Weak::upgrade) {
            w.wake();
        }
    }

    /// A handle for one connection's task.
    pub(crate) fn watch(self: &Arc<Self>) -> StageWatch {
        let waker = Arc::new(AtomicWaker::new());
        let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        if watchers.list.len() >= watchers.prune_at {
            // Amortized: the list at most doubles between prunes.
            watchers.list.retain(|w| w.strong_count() > 0);
            watchers.prune_at = (watchers.list.len() * 2).max(64);
        }
        watchers.list.push(Arc::downgrade(&waker));
        StageWatch {
            stages: self.clone(),
            waker,
            seen: Stage::Serving,
        }
    }
}

/// One connection's view of the stage.
pub(crate) struct StageWatch {
    stages: Arc<Stages>,
    waker: Arc<AtomicWaker>,
    seen: Stage,
}

impl StageWatch {
    /// Resolves with the new stage once it differs from the last one seen.
    pub(crate) fn changed(&mut self) -> Changed<'_> {
        Changed(self)
    }
}

/// [`StageWatch::changed`].
pub(crate) struct Changed<'a>(&'a mut StageWatch);

impl Future for Changed<'_> {
    type Output = Stage;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Stage> {
        let watch = &mut *self.get_mut().0;
        // Register first, then look: a change made in between still wakes.
        watch.waker.register(cx.waker());
        let now = Stage::from_u8(watch.stages.stage.load(Ordering::Acquire));
        if now == watch.seen {
            return Poll::Pending;
        }
        watch.seen = now;
        Poll::Ready(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn every_watcher_sees_each_change() {
        let stages = Arc::new(Stages::default());
        let mut watchers: Vec<StageWatch> = (0..200).map(|_| stages.watch()).collect();
        // Dropped watchers are pruned, live ones kept.
        watchers.truncate(100);
        let more: Vec<StageWatch> = (0..100).map(|_| stages.watch()).collect();
        watchers.extend(more);
        let tasks: Vec<_> = watchers
            .into_iter()
            .map(|mut w| {
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    while seen.last() != Some(&Stage::Closing) {
                        seen.push(w.changed().await);
                    }
                    seen
                })
            })
            .collect();
        tokio::task::yield_now().await;
        stages.set(Stage::Draining);
        tokio::time::sleep(Duration::from_millis(10)).await;
        stages.set(Stage::Closing);
        for t in tasks {
            let seen = tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("woken")
                .expect("task");
            // A watcher that ran late may have missed Draining, never Closing.
            assert!(
                seen == [Stage::Draining, Stage::Closing] || seen == [Stage::Closing],
                "{seen:?}"
            );
        }
        let live = stages
            .watchers
            .lock()
            .map(|w| w.list.iter().filter(|w| w.strong_count() > 0).count())
            .unwrap_or(0);
        assert_eq!(live, 0, "ended watchers hold nothing");
    }
}
