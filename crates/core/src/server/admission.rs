//! Connection admission: at most `max_connections` open at once, and at
//! most `max_connections_per_peer` from one IP address. A connection past a
//! limit is refused right after `accept` (the caller drops it), so it never
//! holds a descriptor, and established connections are never touched.

use super::metrics::{ListenerMetrics, Refusal};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How often, at most, a listener logs that it is refusing connections.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The connection limits of one listener and what is open now.
pub struct Admission {
    max: usize,
    per_peer: Option<usize>,
    /// Connections holding a [`Slot`] now.
    open: AtomicUsize,
    /// Open connections per peer address, only while a per-peer cap is set;
    /// an address leaves the map with its last connection.
    peers: Mutex<HashMap<IpAddr, usize>>,
    metrics: ListenerMetrics,
    /// Refusals not yet reported in a log line, and when the last line was
    /// written: a flood is one warning every [`WARN_EVERY`], not one per
    /// connection.
    unreported: AtomicU64,
    last_warned: Mutex<Option<Instant>>,
}

/// One admitted connection's place; dropping it frees the place.
pub struct Slot {
    admission: Arc<Admission>,
    peer: Option<IpAddr>,
}

impl Admission {
    /// Admission for `max` connections, at most `per_peer` per address.
    pub fn new(max: usize, per_peer: Option<usize>, metrics: ListenerMetrics) -> Arc<Self> {
        Arc::new(Admission {
            max,
            per_peer,
            open: AtomicUsize::new(0),
            peers: Mutex::new(HashMap::new()),
            metrics,
            unreported: AtomicU64::new(0),
            last_warned: Mutex::new(None),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A slot for a new connection from `peer` (`None`: a peer without an
    /// address, capped only by the total), or why there is none. A refusal
    /// is counted and, rate-limited, logged.
    pub fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Slot, Refusal> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(self.refuse(Refusal::MaxConnections, peer));
        }
        let peer = match (self.per_peer, peer.map(peer_key)) {
            (Some(cap), Some(ip)) => {
                let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
                let n = peers.entry(ip).or_insert(0);
                if *n >= cap {
                    drop(peers);
                    self.open.fetch_sub(1, Ordering::AcqRel);
                    return Err(self.refuse(Refusal::MaxConnectionsPerPeer, Some(ip)));
                }
                *n += 1;
                Some(ip)
            }
            _ => None,
        };
        self.metrics.opened();
        Ok(Slot {
            admission: self.clone(),
            peer,
        })
    }

    fn refuse(&self, reason: Refusal, peer: Option<IpAddr>) -> Refusal {
        self.metrics.refused(reason);
        self.unreported.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut last = self.last_warned.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| now.duration_since(at) >= WARN_EVERY) {
            *last = Some(now);
            let refused = self.unreported.swap(0, Ordering::Relaxed);
            let limit = match reason {
                Refusal::MaxConnections => self.max,
                Refusal::MaxConnectionsPerPeer => self.per_peer.unwrap_or(0),
            };
            tracing::warn!(
                listener = self.metrics.name,
                reason = reason.as_str(),
                limit,
                ?peer,
                refused,
                open = self.open(),
                "refusing new connections: a connection limit is reached (established \
                 connections keep working; at most one such line every {WARN_EVERY:?})"
            );
        }
        reason
    }
}

/// Whose share of the per-peer cap a connection from `ip` takes: its IPv4
/// address (also when it arrives IPv4-mapped on a dual-stack listener), or
/// its IPv6 /64, the least one host is usually given.
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let a = &self.admission;
        if let Some(ip) = self.peer {
            let mut peers = a.peers.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = peers.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    peers.remove(&ip);
                }
            }
        }
        a.open.fetch_sub(1, Ordering::AcqRel);
        a.metrics.closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Metrics;

    #[test]
    fn limits_hold_and_slots_free_their_place() {
        let a = Admission::new(3, Some(2), Metrics::default().listener("t"));
        let one: IpAddr = [127, 0, 0, 1].into();
        let two: IpAddr = [127, 0, 0, 2].into();
        let s1 = a.admit(Some(one)).expect("first");
        let _s2 = a.admit(Some(one)).expect("second");
        assert_eq!(
            a.admit(Some(one)).err(),
            Some(Refusal::MaxConnectionsPerPeer)
        );
        let _s3 = a.admit(Some(two)).expect("another peer");
        assert_eq!(a.admit(Some(two)).err(), Some(Refusal::MaxConnections));
        assert_eq!(a.admit(None).err(), Some(Refusal::MaxConnections));
        drop(s1);
        assert_eq!(a.open(), 2);
        let _again = a.admit(Some(one)).expect("a freed place is free");
        let peers = a.peers.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(peers.get(&one), Some(&2));
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_a_mapped_one_its_ipv4_address() {
        let a = Admission::new(10, Some(1), Metrics::default().listener("t"));
        let one: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("ip");
        let other_64: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        let _s = a.admit(Some(one)).expect("first");
        assert_eq!(
            a.admit(Some(same_64)).err(),
            Some(Refusal::MaxConnectionsPerPeer)
        );
        let _t = a.admit(Some(other_64)).expect("another /64");
        let v4: IpAddr = [192, 0, 2, 1].into();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().expect("ip");
        let _u = a.admit(Some(v4)).expect("v4");
        assert_eq!(
            a.admit(Some(mapped)).err(),
            Some(Refusal::MaxConnectionsPerPeer)
        );
    }

    #[test]
    fn peers_leave_the_map_with_their_last_connection() {
        let a = Admission::new(10, Some(5), Metrics::default().listener("t"));
        let ip: IpAddr = [10, 0, 0, 1].into();
        let slots: Vec<Slot> = (0..5).map(|_| a.admit(Some(ip)).expect("admit")).collect();
        drop(slots);
        assert!(a.peers.lock().unwrap_or_else(|p| p.into_inner()).is_empty());
        assert_eq!(a.open(), 0);
    }
}
