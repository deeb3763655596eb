//! Input checks for every RPC, run before anything touches the store, so bad
//! input is rejected with a message naming the problem and nothing written.

use crate::error::{Error, Result};
use crate::store::{ListCursor, ListOrder, SandboxRef, State};
use std::collections::{BTreeMap, HashMap};
use warren_core::id::{validate_node_id, validate_sandbox_id};
use warren_proto::scheduler::v1 as pb;

/// Default sandbox lifetime when `timeout_secs` is 0 (E2B's default).
const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// Longest lifetime accepted, so `now + timeout` stays far from overflow.
pub const MAX_TIMEOUT_SECS: u64 = 365 * 86_400;
/// `ListSandboxes` page size when 0 is asked for, and the cap.
const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;
/// Bound on roster and event batch sizes.
const MAX_ROSTER: usize = 100_000;
pub const MAX_EVENTS: usize = 1000;

const MAX_LABEL: usize = 128;
const MAX_ENDPOINT: usize = 255;
const MAX_KEY: usize = 256;
const MAX_IDEMPOTENCY_KEY: usize = 256;
const MAX_METADATA_PAIRS: usize = 128;
const MAX_METADATA_VALUE: usize = 4096;
const MAX_ENV_PAIRS: usize = 512;
const MAX_ENV_VALUE: usize = 128 * 1024;
const PAGE_TOKEN_PREFIX: &str = "v1.";
const TIME_PAGE_TOKEN_PREFIX: &str = "v2.";

pub fn sandbox_id(id: &str) -> Result<()> {
    Ok(validate_sandbox_id(id)?)
}

pub fn node_id(id: &str) -> Result<()> {
    Ok(validate_node_id(id)?)
}

pub fn generation(g: u64) -> Result<()> {
    if g == 0 {
        return Err(Error::invalid(
            "generation 0 is not a generation (they start at 1)",
        ));
    }
    Ok(())
}

/// `host:port` with a non-zero port, no spaces or control characters.
pub fn endpoint(ep: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid(format!("endpoint {ep:?} {why}")));
    if ep.is_empty() {
        return Err(Error::invalid("endpoint is empty"));
    }
    if ep.len() > MAX_ENDPOINT {
        return bad(&format!("is longer than {MAX_ENDPOINT} bytes"));
    }
    if ep.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("contains whitespace or control characters");
    }
    match ep.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() => match port.parse::<u16>() {
            Ok(p) if p != 0 => Ok(()),
            _ => bad("has no valid port (expected host:port)"),
        },
        _ => bad("is not host:port"),
    }
}

pub fn capacity(c: u32) -> Result<()> {
    if c == 0 {
        return Err(Error::invalid("capacity must be at least 1 sandbox"));
    }
    Ok(())
}

pub fn incarnation(i: u64) -> Result<()> {
    if i == 0 {
        return Err(Error::invalid(
            "incarnation must be non-zero (pick a fresh value at every process start)",
        ));
    }
    Ok(())
}

pub fn roster(entries: &[pb::SandboxRef]) -> Result<Vec<SandboxRef>> {
    if entries.len() > MAX_ROSTER {
        return Err(Error::invalid(format!(
            "roster has {} entries; the limit is {MAX_ROSTER}",
            entries.len()
        )));
    }
    entries
        .iter()
        .map(|r| {
            sandbox_id(&r.sandbox_id)
                .and_then(|()| generation(r.generation))
                .map_err(|e| Error::invalid(format!("roster entry {:?}: {e}", r.sandbox_id)))?;
            Ok(SandboxRef {
                sandbox_id: r.sandbox_id.clone(),
                generation: r.generation,
            })
        })
        .collect()
}

/// Free-form short labels (team, template): bounded and printable.
pub fn label(what: &str, v: &str) -> Result<()> {
    if v.len() > MAX_LABEL {
        return Err(Error::invalid(format!(
            "{what} is {} bytes long; the limit is {MAX_LABEL}",
            v.len()
        )));
    }
    if v.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "{what} contains control characters"
        )));
    }
    Ok(())
}

pub fn idempotency_key(k: &str) -> Result<Option<String>> {
    if k.is_empty() {
        return Ok(None);
    }
    if k.len() > MAX_IDEMPOTENCY_KEY {
        return Err(Error::invalid(format!(
            "idempotency key is {} bytes long; the limit is {MAX_IDEMPOTENCY_KEY}",
            k.len()
        )));
    }
    Ok(Some(k.to_string()))
}

pub fn metadata(m: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    string_map("metadata", m, MAX_METADATA_PAIRS, MAX_METADATA_VALUE)
}

pub fn env_vars(m: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    string_map("env_vars", m, MAX_ENV_PAIRS, MAX_ENV_VALUE)
}

fn string_map(
    what: &str,
    m: &HashMap<String, String>,
    max_pairs: usize,
    max_value: usize,
) -> Result<BTreeMap<String, String>> {
    if m.len() > max_pairs {
        return Err(Error::invalid(format!(
            "{what} has {} entries; the limit is {max_pairs}",
            m.len()
        )));
    }
    for (k, v) in m {
        if k.is_empty() || k.len() > MAX_KEY {
            return Err(Error::invalid(format!(
                "{what} key {:?} must be 1..={MAX_KEY} bytes",
                k.chars().take(40).collect::<String>()
            )));
        }
        if v.len() > max_value {
            return Err(Error::invalid(format!(
                "{what} value for {k:?} is {} bytes; the limit is {max_value}",
                v.len()
            )));
        }
    }
    Ok(m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

pub fn timeout_secs(t: u64) -> Result<u64> {
    match t {
        0 => Ok(DEFAULT_TIMEOUT_SECS),
        t if t > MAX_TIMEOUT_SECS => Err(Error::invalid(format!(
            "timeout_secs {t} is above the limit of {MAX_TIMEOUT_SECS}"
        ))),
        t => Ok(t),
    }
}

pub fn states(v: &[i32]) -> Result<Vec<State>> {
    v.iter()
        .map(|s| {
            crate::service::convert::state_from_pb(*s)
                .ok_or_else(|| Error::invalid(format!("{s} is not a binding state filter")))
        })
        .collect()
}

pub fn page_size(n: u32) -> u32 {
    match n {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    }
}

pub fn list_order(v: i32) -> Result<ListOrder> {
    match pb::ListOrder::try_from(v) {
        Ok(pb::ListOrder::Unspecified) => Ok(ListOrder::ById),
        Ok(pb::ListOrder::StartedDesc) => Ok(ListOrder::StartedDesc),
        Ok(pb::ListOrder::StartedAsc) => Ok(ListOrder::StartedAsc),
        Err(_) => Err(Error::invalid(format!("unknown list order {v}"))),
    }
}

/// Page tokens are opaque to clients; inside, the last sandbox listed:
/// `v1.<id>` by id, `v2.<started_at_ms>.<id>` by start time. A token only
/// continues a listing in the order it came from.
pub fn page_token(t: &str, order: ListOrder) -> Result<Option<ListCursor>> {
    if t.is_empty() {
        return Ok(None);
    }
    let foreign = || Error::invalid("page_token is not one this scheduler issued for this order");
    let cursor = match order {
        ListOrder::ById => ListCursor {
            sandbox_id: t
                .strip_prefix(PAGE_TOKEN_PREFIX)
                .ok_or_else(foreign)?
                .to_string(),
            started_at_ms: 0,
        },
        ListOrder::StartedDesc | ListOrder::StartedAsc => {
            let (ms, id) = t
                .strip_prefix(TIME_PAGE_TOKEN_PREFIX)
                .and_then(|rest| rest.split_once('.'))
                .ok_or_else(foreign)?;
            ListCursor {
                sandbox_id: id.to_string(),
                started_at_ms: ms.parse().map_err(|_| foreign())?,
            }
        }
    };
    validate_sandbox_id(&cursor.sandbox_id).map_err(|_| foreign())?;
    Ok(Some(cursor))
}

pub fn make_page_token(last: &ListCursor, order: ListOrder) -> String {
    match order {
        ListOrder::ById => format!("{PAGE_TOKEN_PREFIX}{}", last.sandbox_id),
        ListOrder::StartedDesc | ListOrder::StartedAsc => format!(
            "{TIME_PAGE_TOKEN_PREFIX}{}.{}",
            last.started_at_ms, last.sandbox_id
        ),
    }
}

pub fn event_type(v: i32) -> Result<crate::store::EventType> {
    use crate::store::EventType;
    match pb::EventType::try_from(v) {
        Ok(pb::EventType::Create) => Ok(EventType::Create),
        Ok(pb::EventType::Delete) => Ok(EventType::Delete),
        Ok(pb::EventType::Pause) => Ok(EventType::Pause),
        Ok(pb::EventType::Resume) => Ok(EventType::Resume),
        Ok(pb::EventType::Fork) => Ok(EventType::Fork),
        Ok(pb::EventType::Unspecified) | Err(_) => {
            Err(Error::invalid(format!("{v} is not an event type")))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert!(endpoint("127.0.0.1:8080").is_ok());
        assert!(endpoint("node-1.internal:80").is_ok());
        assert!(endpoint("[::1]:80").is_ok());
        for bad in ["", "host", ":80", "host:0", "host:x", "a b:1", "h:99999"] {
            assert!(endpoint(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn page_tokens_round_trip() {
        let last = ListCursor {
            sandbox_id: "abc123".into(),
            started_at_ms: 1_700_000_000_000,
        };
        let t = make_page_token(&last, ListOrder::ById);
        assert_eq!(
            page_token(&t, ListOrder::ById)
                .unwrap()
                .map(|c| c.sandbox_id)
                .as_deref(),
            Some("abc123")
        );
        assert!(page_token("abc123", ListOrder::ById).is_err());
        assert!(page_token("v1.ABC", ListOrder::ById).is_err());
        assert_eq!(page_token("", ListOrder::ById).unwrap(), None);
        let t = make_page_token(&last, ListOrder::StartedDesc);
        assert_eq!(page_token(&t, ListOrder::StartedDesc).unwrap(), Some(last));
        assert!(
            page_token(&t, ListOrder::ById).is_err(),
            "a token continues only its own order"
        );
        assert!(page_token("v2.x.abc123", ListOrder::StartedAsc).is_err());
    }
}
