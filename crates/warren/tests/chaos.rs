//! `warren chaos failover`, short runs for each component: two
//! scheduler replicas on a private PostgreSQL server the command starts, two
//! gateways, two nodes, HAProxy L4 and L7. Each run kills one replica and
//! must lose no data: no idempotency key with two sandboxes, every command
//! stream's assembled output complete and in order, no workflow whose
//! outcome is unknown; and the outputs must exist with denominators that
//! add up.
//!
//! The runs share the machine's two cores with nothing else of theirs: a
//! lock runs them one at a time.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use warren_chaos::record::{Outcome, Record};
use warren_chaos::Summary;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// Runs a short experiment; returns the summary and every record.
fn failover(component: &str) -> (Summary, Vec<Record>) {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::Builder::new()
        .prefix("warren-chaos-test-")
        .tempdir()
        .expect("temp dir");
    let run = Command::new(bin())
        .args([
            "chaos",
            "failover",
            "--component",
            component,
            "--signal",
            "KILL",
            "--baseline",
            "2s",
            "--observe",
            "3s",
            "--probe-interval",
            "300ms",
            "--max-probes",
            "100",
            "--seed",
            "7",
            "--out",
        ])
        .arg(out.path())
        .output()
        .expect("warren chaos runs");
    assert!(
        run.status.success(),
        "warren chaos failover --component {component} reported lost data or could not run \
         ({}):\n{}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );

    for f in [
        "probes.json",
        "probes.csv",
        "summary.json",
        "summary.md",
        "timeline.svg",
    ] {
        assert!(out.path().join(f).is_file(), "{f} was written");
    }
    let read = |f: &str| std::fs::read(out.path().join(f)).expect("output readable");
    let summary: Summary = serde_json::from_slice(&read("summary.json")).expect("summary.json");
    let records: Vec<Record> = serde_json::from_slice(&read("probes.json")).expect("probes.json");
    // Complete denominators: every record is in the JSON, the CSV and the table.
    assert_eq!(summary.records, records.len());
    let csv = String::from_utf8(read("probes.csv")).expect("utf-8 csv");
    assert_eq!(
        csv.lines().count(),
        records.len() + 1,
        "a header + a line per probe"
    );
    let counted: u64 = summary.rows.iter().map(|r| r.total.attempts).sum();
    assert_eq!(counted, records.len() as u64);
    for r in &summary.rows {
        assert_eq!(
            r.total.attempts,
            r.total.ok + r.total.refused + r.total.failed
        );
    }
    // Every probe kind ran through both balancers.
    let seen: BTreeSet<(String, String)> = records
        .iter()
        .map(|r| (r.kind.clone(), r.entry.clone()))
        .collect();
    for kind in ["list", "command", "workflow", "stream"] {
        for entry in ["l4", "l7"] {
            assert!(
                seen.contains(&(kind.to_string(), entry.to_string())),
                "no {kind} probe through {entry}"
            );
        }
    }
    let svg = String::from_utf8(read("timeline.svg")).expect("utf-8 svg");
    assert!(svg.starts_with("<svg") && svg.contains("SIGKILL"));

    // No lost data.
    assert!(
        summary.reconciled.duplicate_keys.is_empty(),
        "idempotency keys with two sandboxes: {:?}",
        summary.reconciled.duplicate_keys
    );
    assert_eq!(
        summary.unknown_workflows, 0,
        "every workflow's outcome is known"
    );
    assert_eq!(summary.streams, 2, "one long stream per balancer");
    assert_eq!(
        summary.complete_streams,
        2,
        "every stream's output complete and in order: {:?}",
        records
            .iter()
            .filter(|r| r.kind == "stream")
            .map(|r| (&r.entry, r.outcome, &r.error, &r.detail))
            .collect::<Vec<_>>()
    );
    (summary, records)
}

#[test]
fn killing_a_gateway_loses_no_data() {
    let (summary, _) = failover("gateway");
    assert_eq!(summary.replica, "gateway-1");
}

#[test]
fn killing_a_scheduler_replica_loses_no_data() {
    let (summary, _) = failover("scheduler");
    assert!(summary.replica.starts_with("scheduler-"));
}

#[test]
fn killing_a_node_refuses_its_sandboxes_clearly_and_leaves_the_survivors_alone() {
    let (summary, records) = failover("node");
    assert_eq!(summary.replica, "node-1");
    let on = |node: &'static str| {
        records
            .iter()
            .filter(move |r| r.kind == "command" && r.target == node)
    };
    // The killed node's sandbox is really gone: probes for it get the clear
    // node-down / unreachable / not-found answer.
    assert!(
        on("node-1").any(|r| r.outcome == Outcome::Refused),
        "the killed node's sandbox was refused clearly"
    );
    // The survivor's sandbox answers every probe.
    let survivor_failures: Vec<_> = on("node-2")
        .filter(|r| r.outcome != Outcome::Ok)
        .map(|r| (&r.error, &r.detail))
        .collect();
    assert!(
        survivor_failures.is_empty(),
        "the surviving node's sandbox kept working: {survivor_failures:?}"
    );
}
