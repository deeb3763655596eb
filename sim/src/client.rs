//! The run's clients: users that create, use, pause, resume, fork and
//! delete sandboxes through both gateways while the faults happen, then,
//! once the faults have stopped and [`crate::SETTLE`] has passed, the
//! quiescence checks (docs/simulation.md, "Invariants").

use crate::check::{self, Sent};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use warren_scheduler::store::{SqlStore, State};

/// How many users act at once.
const USERS: u64 = 3;
/// How long a client waits for one answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the clients believe of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Believed {
    Running,
    Paused,
    /// A client deleted it (2xx).
    Deleted,
    /// An operation on it got no answer or an error: its state is unknown.
    Unsure,
    /// A delete of it got no answer or an error: it may be gone.
    MaybeDeleted,
}

#[derive(Default)]
struct Model {
    /// Sandboxes a create or fork answered, in the order they were made.
    sandboxes: Vec<(String, Believed)>,
    next_request: u64,
    next_key: u64,
    /// Sandboxes paused filesystem-only by a client (2xx).
    fs_paused: std::collections::BTreeSet<String>,
    /// Of those, the ones a resume of did not clearly succeed (no answer,
    /// or 5xx): maybe a move that did not complete.
    failed_moves: std::collections::BTreeSet<String>,
}

type Shared = Rc<RefCell<Model>>;

/// An answer: status and body; `None` when none came.
type Answer = Option<(u16, Bytes)>;

/// Sends one request to a gateway over a fresh connection.
async fn call(
    gateway: &str,
    method: http::Method,
    path: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
) -> Answer {
    let attempt = async {
        let stream =
            turmoil::net::TcpStream::connect(format!("{gateway}:{}", crate::world::GATEWAY_PORT))
                .await
                .ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, format!("{gateway}:3000"))
            .header("x-api-key", crate::world::API_KEY);
        for (k, v) in headers {
            req = req.header(*k, v.as_str());
        }
        let body = body.unwrap_or_default();
        if !body.is_empty() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body))).ok()?;
        let resp = sender.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, attempt)
        .await
        .ok()
        .flatten()
}

fn trace(line: String) {
    check::with(|c| c.trace.push(format!("t={} {line}", check::now_ms())));
}

/// Notes a resume of a sandbox paused filesystem-only that did not
/// clearly succeed (no answer, 5xx, or 404: the new placement was lost
/// before the move completed): it may have been a move that did not
/// complete.
fn note_failed_move(model: &Shared, id: &str, answer: &Answer) {
    let failed = match answer {
        None => true,
        Some((s, _)) => *s >= 500 || *s == 404,
    };
    let mut m = model.borrow_mut();
    if failed && m.fs_paused.contains(id) {
        m.failed_moves.insert(id.to_string());
    }
}

/// Records an answer: the trace, and the documented-answers check.
fn answered(what: &str, gateway: &str, answer: &Answer) {
    match answer {
        Some((status, body)) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(160)]).into_owned();
            trace(format!("{what} via {gateway} -> {status} {text}"));
            check::with(|c| c.answered(what, *status, body));
        }
        None => trace(format!("{what} via {gateway} -> no answer")),
    }
}

/// Every `sandboxID` in a JSON answer (a create's, or a fork's list).
fn sandbox_ids(body: &[u8]) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("sandboxID", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        walk(&v, &mut out);
    }
    out
}

fn gateway(rng: &mut rand::rngs::StdRng) -> &'static str {
    crate::world::GATEWAYS[rng.random_range(0..crate::world::GATEWAYS.len())]
}

fn pick(model: &Shared, rng: &mut rand::rngs::StdRng) -> Option<(usize, String)> {
    pick_where(model, rng, |_| true)
}

/// A sandbox not deleted, preferring those `prefer` says (half the time).
fn pick_where(
    model: &Shared,
    rng: &mut rand::rngs::StdRng,
    prefer: impl Fn(Believed) -> bool,
) -> Option<(usize, String)> {
    let m = model.borrow();
    let mut live: Vec<usize> = (0..m.sandboxes.len())
        .filter(|i| m.sandboxes[*i].1 != Believed::Deleted)
        .collect();
    let preferred: Vec<usize> = live
        .iter()
        .copied()
        .filter(|i| prefer(m.sandboxes[*i].1))
        .collect();
    if !preferred.is_empty() && rng.random_bool(0.5) {
        live = preferred;
    }
    if live.is_empty() {
        return None;
    }
    let i = live[rng.random_range(0..live.len())];
    Some((i, m.sandboxes[i].0.clone()))
}

fn believe(model: &Shared, i: usize, b: Believed) {
    if let Some(s) = model.borrow_mut().sandboxes.get_mut(i) {
        // A delete a client saw succeed is final, whatever a concurrent
        // operation on it answered.
        // A delete that may have happened stays possible.
        match (s.1, b) {
            (Believed::Deleted, _) => {}
            (Believed::MaybeDeleted, b) if b != Believed::Deleted => {}
            _ => s.1 = b,
        }
    }
}

async fn create(model: &Shared, rng: &mut rand::rngs::StdRng, user: u64) {
    let key = rng.random_bool(0.7).then(|| {
        let mut m = model.borrow_mut();
        m.next_key += 1;
        format!("key-{user}-{}", m.next_key)
    });
    let body = serde_json::json!({
        "templateID": "base",
        "timeout": 600,
        "autoResume": {"enabled": rng.random_bool(0.5)},
    })
    .to_string()
    .into_bytes();
    // With a key, a create that got no clear answer is retried with it:
    // one key must still make at most one sandbox.
    let tries = if key.is_some() { 3 } else { 1 };
    for _ in 0..tries {
        let gw = gateway(rng);
        let headers: Vec<(&str, String)> = key
            .iter()
            .map(|k| (warren_core::headers::IDEMPOTENCY_KEY, k.clone()))
            .collect();
        let answer = call(
            gw,
            http::Method::POST,
            "/sandboxes",
            &headers,
            Some(body.clone()),
        )
        .await;
        answered(&format!("user {user} create key={key:?}"), gw, &answer);
        match answer {
            Some((201, body)) => {
                for id in sandbox_ids(&body) {
                    if let Some(k) = &key {
                        check::with(|c| c.created_with_key(k, &id));
                    }
                    let mut m = model.borrow_mut();
                    if !m.sandboxes.iter().any(|(s, _)| *s == id) {
                        m.sandboxes.push((id, Believed::Running));
                    }
                }
                return;
            }
            Some((s, _)) if s < 500 => return,
            _ => tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await,
        }
    }
}

/// One data-plane request: `GET` (replayable), `POST` (not), or `POST`
/// with an idempotency key (replayable).
async fn data(model: &Shared, rng: &mut rand::rngs::StdRng, user: u64) {
    let Some((_, id)) = pick(model, rng) else {
        return;
    };
    let kind = rng.random_range(0..3);
    let r = {
        let mut m = model.borrow_mut();
        m.next_request += 1;
        user * 1_000_000 + m.next_request
    };
    let replayable = kind != 1;
    check::with(|c| {
        c.sent.insert(
            r,
            Sent {
                sandbox_id: id.clone(),
                replayable,
            },
        )
    });
    let mut headers = vec![
        (warren_core::headers::E2B_SANDBOX_ID, id.clone()),
        (
            warren_core::headers::E2B_SANDBOX_PORT,
            warren_core::headers::ENVD_PORT.to_string(),
        ),
        (crate::REQUEST_HEADER, r.to_string()),
    ];
    let (method, body) = match kind {
        0 => (http::Method::GET, None),
        1 => (http::Method::POST, Some(b"{\"n\":1}".to_vec())),
        _ => {
            headers.push((warren_core::headers::IDEMPOTENCY_KEY, format!("req-{r}")));
            (http::Method::POST, Some(b"{\"n\":2}".to_vec()))
        }
    };
    let gw = gateway(rng);
    let answer = call(gw, method.clone(), "/sim", &headers, body).await;
    answered(&format!("user {user} {method} #{r} to {id}"), gw, &answer);
    if let Some((200, body)) = &answer {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        if v.get("sandbox").and_then(|s| s.as_str()) != Some(id.as_str()) {
            let got = String::from_utf8_lossy(body).into_owned();
            check::with(|c| c.violation(format!("request {r} for {id} was answered by {got}")));
        }
    }
}

/// Deletes, pauses (memory kept or filesystem only), resumes, forks or
/// reads one sandbox.
async fn lifecycle(model: &Shared, rng: &mut rand::rngs::StdRng, user: u64) {
    let op = rng.random_range(0..10);
    // Resumes go mostly to paused sandboxes, pauses to running ones.
    let Some((i, id)) = pick_where(model, rng, |b| match op {
        2..=4 => b == Believed::Running,
        5..=7 => b == Believed::Paused,
        _ => true,
    }) else {
        return;
    };
    let gw = gateway(rng);
    let keep_memory = rng.random_bool(0.3);
    let (method, path, body, what) = match op {
        0..=1 => (
            http::Method::DELETE,
            format!("/sandboxes/{id}"),
            None,
            "delete",
        ),
        2..=4 => (
            http::Method::POST,
            format!("/sandboxes/{id}/pause"),
            Some(
                // Mostly filesystem-only: a resume whose node is cut off
                // then moves the sandbox to another node.
                serde_json::json!({"memory": keep_memory})
                    .to_string()
                    .into_bytes(),
            ),
            "pause",
        ),
        5..=7 => (
            http::Method::POST,
            format!("/sandboxes/{id}/resume"),
            Some(b"{\"timeout\":600}".to_vec()),
            "resume",
        ),
        8 => (
            http::Method::POST,
            format!("/sandboxes/{id}/fork"),
            Some(b"{\"timeout\":600}".to_vec()),
            "fork",
        ),
        _ => (http::Method::GET, format!("/sandboxes/{id}"), None, "get"),
    };
    let answer = call(gw, method, &path, &[], body).await;
    answered(&format!("user {user} {what} {id}"), gw, &answer);
    if what == "resume" {
        note_failed_move(model, &id, &answer);
    }
    let status = answer.as_ref().map(|(s, _)| *s);
    match (what, status) {
        ("delete", Some(200 | 204)) => {
            believe(model, i, Believed::Deleted);
            let now = check::now_ms();
            check::with(|c| c.deleted.insert(id.clone(), now));
        }
        ("pause", Some(200 | 204)) => {
            believe(model, i, Believed::Paused);
            if !keep_memory {
                model.borrow_mut().fs_paused.insert(id.clone());
            }
            if !keep_memory && rng.random_bool(0.6) {
                isolate_and_resume(model, rng, user, i, &id).await;
            }
        }
        ("resume", Some(200 | 201)) => believe(model, i, Believed::Running),
        ("fork", Some(200 | 201)) => {
            if let Some((_, body)) = &answer {
                let mut m = model.borrow_mut();
                for child in sandbox_ids(body) {
                    if !m.sandboxes.iter().any(|(s, _)| *s == child) {
                        m.sandboxes.push((child, Believed::Running));
                    }
                }
            }
        }
        ("get", _) | ("fork", _) => {}
        ("delete", _) => believe(model, i, Believed::MaybeDeleted),
        // A failed pause, resume or delete, or none answered: it may or
        // may not have happened.
        (_, Some(409)) => {}
        _ => believe(model, i, Believed::Unsure),
    }
}

/// Cuts the node a filesystem-paused sandbox is on off from both gateways
/// (or from both schedulers, past its lease), and resumes it meanwhile:
/// the resume moves it to another node, and the node that had it, once
/// back, deletes its copy as an orphan (the stale DELETE report the
/// fences must refuse).
async fn isolate_and_resume(
    model: &Shared,
    rng: &mut rand::rngs::StdRng,
    user: u64,
    i: usize,
    id: &str,
) {
    let Some(route) = check::with(|c| c.route_now(id)).flatten() else {
        return;
    };
    let Some(node) = crate::world::NODES
        .iter()
        .find(|n| **n == route.node_id.as_str())
        .copied()
    else {
        return;
    };
    let from: &[&str] = if rng.random_bool(0.5) {
        crate::world::GATEWAYS
    } else {
        crate::world::SCHEDULERS
    };
    trace(format!("user {user} cuts {node} off from {from:?}"));
    for peer in from {
        turmoil::hold(node, *peer);
    }
    let wait = if from == crate::world::SCHEDULERS {
        // Past the lease and a sweep: the binding is LOST.
        crate::LEASE + crate::SWEEP * 2
    } else {
        Duration::from_millis(rng.random_range(50..500))
    };
    tokio::time::sleep(wait).await;
    let gw = gateway(rng);
    let answer = call(
        gw,
        http::Method::POST,
        &format!("/sandboxes/{id}/resume"),
        &[],
        Some(b"{\"timeout\":600}".to_vec()),
    )
    .await;
    answered(
        &format!("user {user} resume {id} (its node cut off)"),
        gw,
        &answer,
    );
    note_failed_move(model, id, &answer);
    match answer.as_ref().map(|(s, _)| *s) {
        Some(200 | 201) => believe(model, i, Believed::Running),
        Some(409) => {}
        _ => believe(model, i, Believed::Unsure),
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
    for peer in from {
        turmoil::release(node, *peer);
    }
    trace(format!("user {user} reconnects {node}"));
}

async fn user(model: Shared, seed: u64, user: u64, ops: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (user << 32) ^ 0x00c1_1e47);
    for _ in 0..ops {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
        match rng.random_range(0..10) {
            0..=1 => create(&model, &mut rng, user).await,
            2..=5 => data(&model, &mut rng, user).await,
            _ => lifecycle(&model, &mut rng, user).await,
        }
    }
}

/// The client host: the users, then the quiescence checks.
pub async fn drive(
    seed: u64,
    ops: usize,
    dead: Option<&'static str>,
    store: Arc<SqlStore>,
) -> turmoil::Result {
    let _ = store;
    let model: Shared = Rc::default();
    let per_user = ops.div_ceil(USERS as usize);
    let users: Vec<_> = (0..USERS)
        .map(|u| tokio::task::spawn_local(user(model.clone(), seed, u, per_user)))
        .collect();
    for u in users {
        let _ = u.await;
    }
    // Quiet from when both the faults and the users (whose own cuts are
    // repaired when their operation ends) have stopped.
    let since_start = Duration::from_millis(check::now_ms());
    let wait = crate::FAULTS_END.saturating_sub(since_start) + crate::SETTLE;
    tokio::time::sleep(wait).await;
    trace("quiescence checks".into());
    quiescence(&model, dead, seed).await;
    Ok(())
}

/// Once quiet: no binding LOST but a dead node's, none stuck CREATING,
/// nothing a client deleted back, nothing vanished that was not on a node
/// that died, and every running sandbox reachable through every gateway
/// (within [`crate::REACH_BOUND`]).
async fn quiescence(model: &Shared, dead: Option<&'static str>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e1e7);
    if let Some(node) = dead {
        let bindings = check::with(|c| c.bindings(Some(node))).unwrap_or_default();
        for b in bindings {
            if b.state != State::Lost {
                check::with(|c| {
                    c.violation(format!(
                        "sandbox {} is {:?} on {node}, dead for {:?}, past lease + sweep",
                        b.sandbox_id,
                        b.state,
                        crate::SETTLE
                    ))
                });
            }
        }
    }
    let sandboxes: BTreeMap<String, Believed> = model.borrow().sandboxes.iter().cloned().collect();
    for (id, believed) in sandboxes {
        let route = check::with(|c| c.route_now(&id)).flatten();
        // Known, not fixed (docs/simulation.md, "Known gaps"): a
        // filesystem-paused sandbox whose move to another node did not
        // complete (the boot there failed, or its gateway died midway) is
        // left CREATING there and removed as a stuck create, record and all.
        let failed_move = model.borrow().failed_moves.contains(&id);
        let lost = failed_move || check::with(|c| c.may_have_died(&id)).unwrap_or(false);
        match (route, believed) {
            (Some(r), Believed::Deleted) => check::with(|c| {
                c.violation(format!(
                    "sandbox {id}, deleted by a client, is back: {:?} at generation {} on {}",
                    r.state, r.generation, r.node_id
                ))
            })
            .unwrap_or(()),
            (None, Believed::Deleted | Believed::MaybeDeleted) => {}
            (None, _) if lost => {}
            (None, _) => check::with(|c| {
                c.violation(format!(
                    "sandbox {id} vanished: no client deleted it and no node it was on died"
                ))
            })
            .unwrap_or(()),
            (Some(r), _) if r.state == State::Lost && Some(r.node_id.as_str()) == dead => {}
            (Some(r), _) if matches!(r.state, State::Lost | State::Creating) => {
                check::with(|c| {
                    c.violation(format!(
                        "sandbox {id} is still {:?} on {} after the faults stopped and {:?} passed",
                        r.state,
                        r.node_id,
                        crate::SETTLE
                    ))
                });
            }
            (Some(r), Believed::Running) if r.state == State::Paused && !lost => {
                check::with(|c| {
                    c.violation(format!(
                        "sandbox {id} is paused on {}, but no client paused it since its last resume",
                        r.node_id
                    ))
                });
            }
            (Some(r), _) if r.state == State::Running => reach(&id, r.generation, &mut rng).await,
            (Some(_), _) => {}
        }
    }
}

/// A running sandbox answers through every gateway within the bound.
async fn reach(id: &str, generation: u64, rng: &mut rand::rngs::StdRng) {
    for gw in crate::world::GATEWAYS {
        let deadline = tokio::time::Instant::now() + crate::REACH_BOUND;
        let mut last = None;
        let mut reached = false;
        while tokio::time::Instant::now() < deadline {
            let r = 900_000_000 + u64::from(rng.random::<u32>());
            check::with(|c| {
                c.sent.insert(
                    r,
                    Sent {
                        sandbox_id: id.to_string(),
                        replayable: true,
                    },
                )
            });
            let headers = [
                (warren_core::headers::E2B_SANDBOX_ID, id.to_string()),
                (
                    warren_core::headers::E2B_SANDBOX_PORT,
                    warren_core::headers::ENVD_PORT.to_string(),
                ),
                (crate::REQUEST_HEADER, r.to_string()),
            ];
            let answer = call(gw, http::Method::GET, "/sim", &headers, None).await;
            if let Some((200, body)) = &answer {
                let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
                if v.get("generation").and_then(|g| g.as_u64()) == Some(generation) {
                    reached = true;
                    break;
                }
            }
            last = answer.map(|(s, b)| format!("{s} {}", String::from_utf8_lossy(&b)));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !reached {
            check::with(|c| {
                c.violation(format!(
                    "running sandbox {id} (generation {generation}) not reachable through {gw} \
                     within {:?} of quiescence; last answer {last:?}",
                    crate::REACH_BOUND
                ))
            });
        }
    }
}
