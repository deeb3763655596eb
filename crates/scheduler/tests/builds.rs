//! Template builds in the store, through the API of two replicas: a build
//! is created through one and read through the other, claimed by exactly
//! one of several gateways, run under a lease whose end is noticed (the
//! build fails cleanly and is not taken over), its log kept within the
//! build's and the team's bounds, its held count bounded, the uploads it
//! reads kept while it builds.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tonic::{Code, Status};
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::{BlobRemoval, BuildStatus};

const HOUR: u64 = 3_600_000;

fn create_req(id: &str, team: &str, bounds: pb::BuildBounds) -> pb::CreateBuildRequest {
    pb::CreateBuildRequest {
        build_id: id.into(),
        team_id: team.into(),
        template_name: "app".into(),
        request_json: r#"{"alias":"app"}"#.into(),
        start_ttl_ms: HOUR,
        retention_ms: HOUR,
        bounds: Some(bounds),
    }
}

async fn create(c: &mut Client, id: &str, team: &str) -> Result<pb::Build, Status> {
    create_bounded(c, id, team, pb::BuildBounds::default()).await
}

async fn create_bounded(
    c: &mut Client,
    id: &str,
    team: &str,
    bounds: pb::BuildBounds,
) -> Result<pb::Build, Status> {
    c.create_build(create_req(id, team, bounds))
        .await
        .map(|r| r.into_inner())
}

fn claim_req(id: &str, team: &str, owner: &str, lease_ms: u64) -> pb::ClaimBuildRequest {
    pb::ClaimBuildRequest {
        build_id: id.into(),
        team_id: team.into(),
        template_name: "app".into(),
        owner: owner.into(),
        lease_ms,
        plan_json: r#"{"steps":["RUN make"]}"#.into(),
        upload_hashes: vec![],
    }
}

async fn claim(c: &mut Client, id: &str, team: &str, owner: &str) -> Result<pb::Build, Status> {
    claim_for(c, id, team, owner, HOUR).await
}

async fn claim_for(
    c: &mut Client,
    id: &str,
    team: &str,
    owner: &str,
    lease_ms: u64,
) -> Result<pb::Build, Status> {
    c.claim_build(claim_req(id, team, owner, lease_ms))
        .await
        .map(|r| r.into_inner().build.unwrap())
}

async fn get_build(c: &mut Client, id: &str, team: &str) -> Result<pb::Build, Status> {
    c.get_build(pb::GetBuildRequest {
        build_id: id.into(),
        team_id: team.into(),
    })
    .await
    .map(|r| r.into_inner())
}

async fn renew(c: &mut Client, id: &str, owner: &str) -> Result<pb::Build, Status> {
    c.renew_build_lease(pb::RenewBuildLeaseRequest {
        build_id: id.into(),
        owner: owner.into(),
        lease_ms: HOUR,
    })
    .await
    .map(|r| r.into_inner())
}

async fn finish(
    c: &mut Client,
    id: &str,
    owner: &str,
    status: BuildStatus,
) -> Result<pb::Build, Status> {
    let failed = status == BuildStatus::Error;
    c.update_build_status(pb::UpdateBuildStatusRequest {
        build_id: id.into(),
        owner: owner.into(),
        status: status as i32,
        reason_message: if failed {
            "exit 2".into()
        } else {
            String::new()
        },
        reason_step: if failed {
            "RUN make".into()
        } else {
            String::new()
        },
    })
    .await
    .map(|r| r.into_inner())
}

fn line(message: &str) -> pb::LogLine {
    pb::LogLine {
        level: "info".into(),
        message: message.into(),
        ..Default::default()
    }
}

fn log_bounds(max_build_bytes: u64, max_team_bytes: u64) -> pb::LogBounds {
    pb::LogBounds {
        max_build_bytes,
        max_team_bytes,
        build_bound_name: "--build-log-max-bytes".into(),
        team_bound_name: "--build-log-team-bytes".into(),
    }
}

async fn append(
    c: &mut Client,
    id: &str,
    owner: &str,
    batch: u64,
    lines: &[&str],
    bounds: pb::LogBounds,
) -> Result<pb::AppendBuildLogResponse, Status> {
    c.append_build_log(pb::AppendBuildLogRequest {
        build_id: id.into(),
        owner: owner.into(),
        lines: lines.iter().map(|m| line(m)).collect(),
        bounds: Some(bounds),
        batch,
    })
    .await
    .map(|r| r.into_inner())
}

/// The whole log, read in pages of `limit` lines.
async fn read_log(c: &mut Client, id: &str, team: &str, limit: u32) -> Vec<pb::LogLine> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let r = c
            .read_build_log(pb::ReadBuildLogRequest {
                build_id: id.into(),
                team_id: team.into(),
                from_seq: from,
                limit,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.lines.len() <= limit as usize);
        if r.lines.is_empty() {
            assert_eq!(r.next_seq, from);
            return out;
        }
        from = r.next_seq;
        out.extend(r.lines);
    }
}

fn messages(lines: &[pb::LogLine]) -> Vec<&str> {
    lines.iter().map(|l| l.message.as_str()).collect()
}

fn status(b: &pb::Build) -> BuildStatus {
    BuildStatus::try_from(b.status).unwrap()
}

fn lease_lost(r: Result<impl std::fmt::Debug, Status>, needle: &str) {
    let e = assert_status(r, Code::FailedPrecondition, needle);
    assert_eq!(reason(&e).as_deref(), Some(warren_proto::REASON_LEASE_LOST));
}

async fn a_build_made_through_one_replica_is_run_and_read_through_another(store: TestStore) {
    let a = Sched::start(&store, &[]).await;
    let b = Sched::start(&store, &[]).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let made = create(&mut ca, "b-1", "t").await.unwrap();
    assert_eq!(status(&made), BuildStatus::Waiting);
    assert!(made.owner.is_empty() && made.plan_json.is_empty());
    assert_eq!(made.start_deadline_ms - made.requested_at_ms, HOUR as i64);
    // The same create again (its answer was lost) finds it; another
    // request under the id is refused.
    assert_eq!(create(&mut cb, "b-1", "t").await.unwrap(), made);
    let mut other = create_req("b-1", "t", pb::BuildBounds::default());
    other.request_json = r#"{"alias":"other"}"#.into();
    assert_status(cb.create_build(other).await, Code::AlreadyExists, "b-1");
    // Only its team sees it.
    assert_eq!(get_build(&mut cb, "b-1", "t").await.unwrap(), made);
    assert_status(get_build(&mut cb, "b-1", "u").await, Code::NotFound, "b-1");
    assert_status(
        claim(&mut cb, "b-1", "u", "gw-b").await,
        Code::NotFound,
        "b-1",
    );

    let started = claim(&mut cb, "b-1", "t", "gw-b").await.unwrap();
    assert_eq!(status(&started), BuildStatus::Building);
    assert_eq!(started.owner, "gw-b");
    assert_eq!(started.plan_json, r#"{"steps":["RUN make"]}"#);
    assert!(started.lease_expires_at_ms > started.started_at_ms);
    // The same claim again holds.
    assert_eq!(claim(&mut ca, "b-1", "t", "gw-b").await.unwrap(), started);
    let renewed = renew(&mut ca, "b-1", "gw-b").await.unwrap();
    assert!(renewed.lease_expires_at_ms >= started.lease_expires_at_ms);

    // Log batches through either replica; a batch sent again is kept once.
    let none = log_bounds(0, 0);
    let r = append(&mut cb, "b-1", "gw-b", 1, &["one", "two"], none.clone())
        .await
        .unwrap();
    assert_eq!((r.kept, r.dropped, r.repeated), (2, 0, false));
    let again = append(&mut ca, "b-1", "gw-b", 1, &["one", "two"], none.clone())
        .await
        .unwrap();
    assert!(again.repeated && again.kept == 0, "{again:?}");
    append(&mut ca, "b-1", "gw-b", 2, &["three"], none.clone())
        .await
        .unwrap();
    // Read in pages of one and of many: the same lines, in order.
    let log = read_log(&mut ca, "b-1", "t", 1).await;
    assert_eq!(messages(&log), ["one", "two", "three"]);
    assert_eq!(log.iter().map(|l| l.seq).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(log.iter().all(|l| l.at_ms > 0 && l.level == "info"));
    assert_eq!(read_log(&mut cb, "b-1", "t", 100).await, log);

    let done = finish(&mut ca, "b-1", "gw-b", BuildStatus::Ready)
        .await
        .unwrap();
    assert_eq!(status(&done), BuildStatus::Ready);
    assert_eq!(done.expires_at_ms - done.finished_at_ms, HOUR as i64);
    // The same end again answers as the first; the owner's other writes
    // are refused now that it is not building.
    assert_eq!(
        finish(&mut cb, "b-1", "gw-b", BuildStatus::Ready)
            .await
            .unwrap(),
        done
    );
    lease_lost(renew(&mut cb, "b-1", "gw-b").await, "ready, not building");
    lease_lost(
        append(&mut cb, "b-1", "gw-b", 3, &["late"], none).await,
        "not building",
    );
    // A second build, listed newest first, in pages.
    create(&mut cb, "b-2", "t").await.unwrap();
    let page = cb
        .list_builds(pb::ListBuildsRequest {
            team_id: "t".into(),
            page_size: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.builds.len(), 1);
    let rest = cb
        .list_builds(pb::ListBuildsRequest {
            team_id: "t".into(),
            page_size: 10,
            page_token: page.next_page_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut ids: Vec<String> = page.builds.iter().map(|b| b.build_id.clone()).collect();
    ids.extend(rest.builds.iter().map(|b| b.build_id.clone()));
    ids.sort();
    assert_eq!(ids, ["b-1", "b-2"]);

    // A restarted scheduler has it all.
    a.stop().await;
    b.stop().await;
    let a = Sched::start(&store, &[]).await;
    let mut c = a.client().await;
    assert_eq!(get_build(&mut c, "b-1", "t").await.unwrap(), done);
    assert_eq!(read_log(&mut c, "b-1", "t", 100).await, log);
}

async fn of_several_gateways_claiming_one_build_exactly_one_wins(store: TestStore) {
    let a = Sched::start(&store, &[]).await;
    let b = Sched::start(&store, &[]).await;
    let clients = [a.client().await, b.client().await];
    create(&mut clients[0].clone(), "b-race", "t")
        .await
        .unwrap();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let mut c = clients[i % 2].clone();
            tokio::spawn(async move { claim(&mut c, "b-race", "t", &format!("gw-{i}")).await })
        })
        .collect();
    let mut winners = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(b) => winners.push((i, b)),
            Err(e) => {
                assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
                assert_eq!(
                    reason(&e).as_deref(),
                    Some(warren_proto::REASON_BUILD_STARTED)
                );
                assert!(e.message().contains("already started"), "{e}");
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins");
    let (i, won) = winners.remove(0);
    assert_eq!(won.owner, format!("gw-{i}"));
    // A loser's writes are fenced out; the winner's go on.
    let mut c = clients[1].clone();
    let loser = format!("gw-{}", (i + 1) % 10);
    lease_lost(renew(&mut c, "b-race", &loser).await, "is run by");
    lease_lost(
        append(&mut c, "b-race", &loser, 1, &["x"], log_bounds(0, 0)).await,
        "is run by",
    );
    lease_lost(
        finish(&mut c, "b-race", &loser, BuildStatus::Ready).await,
        "is run by",
    );
    let done = finish(&mut c, "b-race", &won.owner, BuildStatus::Error)
        .await
        .unwrap();
    assert_eq!(status(&done), BuildStatus::Error);
    assert_eq!(
        (done.reason_message.as_str(), done.reason_step.as_str()),
        ("exit 2", "RUN make")
    );
    assert!(read_log(&mut c, "b-race", "t", 100).await.is_empty());
}

/// A build whose gateway stops renewing its lease is failed by the sweep
/// (ERROR, the reason and the log naming the owner), and never handed to
/// another gateway; a build whose lease still holds is left building.
async fn a_build_whose_lease_runs_out_fails_cleanly_and_is_not_taken_over(store: TestStore) {
    let a = Sched::start_fast(&store, &[]).await;
    let b = Sched::start_fast(&store, &[]).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    create(&mut ca, "b-lost", "t").await.unwrap();
    create(&mut ca, "b-live", "t").await.unwrap();
    claim(&mut ca, "b-live", "t", "gw-live").await.unwrap();
    let lost = claim_for(&mut ca, "b-lost", "t", "gw-dead", 1)
        .await
        .unwrap();
    // The dead gateway appended nothing; its lease of 1 ms runs out and a
    // sweep (whichever replica leads) fails the build.
    let failed = eventually("the sweep to fail the build whose lease ran out", || {
        let mut c = cb.clone();
        async move {
            get_build(&mut c, "b-lost", "t")
                .await
                .ok()
                .filter(|b| status(b) == BuildStatus::Error)
        }
    })
    .await;
    assert!(
        failed.reason_message.contains("gw-dead")
            && failed.reason_message.contains("lease")
            && failed.reason_message.contains("not taken over"),
        "{}",
        failed.reason_message
    );
    assert!(failed.finished_at_ms >= lost.lease_expires_at_ms);
    assert_eq!(failed.expires_at_ms - failed.finished_at_ms, HOUR as i64);
    // The SDK's log poll says so too, as the last line.
    let log = read_log(&mut cb, "b-lost", "t", 100).await;
    assert_eq!(messages(&log), [failed.reason_message.as_str()]);
    assert_eq!(log[0].level, "error");
    assert_eq!(failed.log_next_seq, 1);
    // Not taken over: another gateway's claim is refused, and the old
    // owner, were it only slow, learns it lost the build.
    let e = assert_status(
        claim(&mut cb, "b-lost", "t", "gw-other").await,
        Code::FailedPrecondition,
        "already started",
    );
    assert_eq!(
        reason(&e).as_deref(),
        Some(warren_proto::REASON_BUILD_STARTED)
    );
    lease_lost(
        renew(&mut cb, "b-lost", "gw-dead").await,
        "error, not building",
    );
    lease_lost(
        append(&mut cb, "b-lost", "gw-dead", 1, &["late"], log_bounds(0, 0)).await,
        "not building",
    );
    lease_lost(
        finish(&mut cb, "b-lost", "gw-dead", BuildStatus::Ready).await,
        "not building",
    );
    // Its end by the sweep is not mistaken for the owner's own repeat.
    lease_lost(
        finish(&mut cb, "b-lost", "gw-dead", BuildStatus::Error).await,
        "not building",
    );
    // The sweep that failed it left the build with an hour's lease alone.
    let live = get_build(&mut cb, "b-live", "t").await.unwrap();
    assert_eq!(status(&live), BuildStatus::Building);
    renew(&mut cb, "b-live", "gw-live").await.unwrap();
}

async fn a_build_log_is_bounded_per_build_and_per_team(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    // 36 bytes of text + 64 of bookkeeping: each line costs 100.
    let text = |i: usize| format!("{i:02} {}", "x".repeat(33));
    let lines: Vec<String> = (0..5).map(text).collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    assert_eq!(
        refs[0].len() as u64 + warren_scheduler::store::LINE_COST,
        100
    );

    // The build's bound: 350 bytes keeps three lines, then one notice.
    create(&mut c, "b-a", "t").await.unwrap();
    claim(&mut c, "b-a", "t", "gw").await.unwrap();
    let r = append(&mut c, "b-a", "gw", 1, &refs, log_bounds(350, 0))
        .await
        .unwrap();
    assert_eq!(
        (r.kept, r.dropped, r.truncated, r.log_bytes),
        (3, 2, true, 300)
    );
    let r = append(&mut c, "b-a", "gw", 2, &refs[..1], log_bounds(350, 0))
        .await
        .unwrap();
    assert_eq!((r.kept, r.dropped), (0, 1), "one notice, said once");
    let log = read_log(&mut c, "b-a", "t", 100).await;
    let notice = "(more output; the rest is not kept: a build keeps at most 350 bytes of log, \
                  --build-log-max-bytes)";
    assert_eq!(messages(&log), [refs[0], refs[1], refs[2], notice]);
    assert_eq!(log[3].level, "warn");
    let b = finish(&mut c, "b-a", "gw", BuildStatus::Ready)
        .await
        .unwrap();
    assert!(b.log_truncated && b.log_bytes == 300);

    // The team's bound of 400: the next build's second line drops the
    // finished build's log first (it is left saying so), then its own
    // lines go on until the team's bound, and the rest is dropped.
    create(&mut c, "b-b", "t").await.unwrap();
    claim(&mut c, "b-b", "t", "gw").await.unwrap();
    let r = append(&mut c, "b-b", "gw", 1, &refs, log_bounds(0, 400))
        .await
        .unwrap();
    assert_eq!((r.kept, r.dropped, r.truncated), (4, 1, true));
    let log = read_log(&mut c, "b-b", "t", 100).await;
    let notice = "(more output; the rest is not kept: the team's builds keep at most 400 bytes \
                  of log, --build-log-team-bytes)";
    assert_eq!(messages(&log), [refs[0], refs[1], refs[2], refs[3], notice]);
    let dropped = read_log(&mut c, "b-a", "t", 100).await;
    assert_eq!(
        messages(&dropped),
        [
            "(this build's log was dropped: the team's builds keep at most 400 bytes of log, \
          --build-log-team-bytes)"
        ]
    );
    assert_eq!(dropped[0].seq, 4, "numbered after the lines it replaced");
    let usage = c
        .get_team_usage(pb::GetTeamUsageRequest {
            team_id: "t".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((usage.builds, usage.build_log_bytes), (2, 400));
    // Another team's log is not crowded out by this one's.
    create(&mut c, "b-u", "u").await.unwrap();
    claim(&mut c, "b-u", "u", "gw").await.unwrap();
    let r = append(&mut c, "b-u", "gw", 1, &refs[..4], log_bounds(0, 400))
        .await
        .unwrap();
    assert_eq!((r.kept, r.dropped), (4, 0));
}

async fn builds_held_are_bounded_per_team_and_in_all(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let bounds = pb::BuildBounds {
        max_team_builds: 2,
        max_total_builds: 3,
    };
    create_bounded(&mut c, "b-1", "t", bounds).await.unwrap();
    create_bounded(&mut c, "b-2", "t", bounds).await.unwrap();
    // Both waiting: nothing to drop, refused.
    let e = create_bounded(&mut c, "b-3", "t", bounds)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert_eq!(bound(&e).as_deref(), Some(warren_proto::BOUND_TEAM_BUILDS));
    assert_eq!(reason(&e).as_deref(), Some(warren_proto::REASON_QUOTA));
    assert!(e.message().contains("all waiting or building"), "{e}");
    // Once one is finished it makes room: the oldest finished is dropped.
    claim(&mut c, "b-1", "t", "gw").await.unwrap();
    finish(&mut c, "b-1", "gw", BuildStatus::Ready)
        .await
        .unwrap();
    create_bounded(&mut c, "b-3", "t", bounds).await.unwrap();
    assert_status(get_build(&mut c, "b-1", "t").await, Code::NotFound, "b-1");
    // Every team's together: t holds 2, u's first makes 3, its second is
    // refused with the bound for all.
    create_bounded(&mut c, "u-1", "u", bounds).await.unwrap();
    let e = create_bounded(&mut c, "u-2", "u", bounds)
        .await
        .unwrap_err();
    assert_eq!(bound(&e).as_deref(), Some(warren_proto::BOUND_TOTAL_BUILDS));
}

async fn a_building_build_keeps_the_uploads_it_reads(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let hash = "c".repeat(64);
    let up = c
        .put_upload(pb::PutUploadRequest {
            team_id: "t".into(),
            files_hash: hash.clone(),
            blob_digest: blob(40),
            size_bytes: 10,
            ttl_ms: HOUR,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    create(&mut c, "b-copy", "t").await.unwrap();
    // An upload the team does not have is refused, naming it.
    let mut req = claim_req("b-copy", "t", "gw", HOUR);
    req.upload_hashes = vec!["d".repeat(64)];
    let e = assert_status(
        c.claim_build(req.clone()).await,
        Code::FailedPrecondition,
        &"d".repeat(64),
    );
    assert_eq!(
        reason(&e).as_deref(),
        Some(warren_proto::REASON_UPLOAD_MISSING)
    );
    req.upload_hashes = vec![hash.clone()];
    let claimed = c.claim_build(req).await.unwrap().into_inner();
    assert_eq!(claimed.uploads, std::slice::from_ref(&up));
    // The upload is deleted while the build runs: its blob is noted, but
    // not removable while the build names it.
    c.delete_upload(pb::DeleteUploadRequest {
        team_id: "t".into(),
        files_hash: hash,
        expected_version: up.version,
    })
    .await
    .unwrap();
    let note = noted(&mut c, 0).await.remove(0);
    assert_eq!(note.digest, blob(40));
    let remove = |c: Client| {
        let note = note.clone();
        async move {
            let mut c = c;
            c.remove_unused_blob(pb::RemoveUnusedBlobRequest {
                digest: note.digest,
                noted_at_ms: note.noted_at_ms,
            })
            .await
            .unwrap()
            .into_inner()
            .outcome
        }
    };
    assert_eq!(remove(c.clone()).await, BlobRemoval::Named as i32);
    finish(&mut c, "b-copy", "gw", BuildStatus::Ready)
        .await
        .unwrap();
    assert_eq!(remove(c.clone()).await, BlobRemoval::Removed as i32);
}

async fn a_build_never_claimed_is_gone_at_its_start_deadline(store: TestStore) {
    let s = Sched::start_fast(&store, &[]).await;
    let mut c = s.client().await;
    let mut req = create_req("b-late", "t", pb::BuildBounds::default());
    req.start_ttl_ms = 1;
    c.create_build(req).await.unwrap();
    eventually("the waiting build to pass its start deadline", || {
        let mut c = c.clone();
        async move { get_build(&mut c, "b-late", "t").await.err() }
    })
    .await;
    assert_status(
        claim(&mut c, "b-late", "t", "gw").await,
        Code::NotFound,
        "b-late",
    );
    assert_eq!(
        c.get_team_usage(pb::GetTeamUsageRequest {
            team_id: "t".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .builds,
        0,
        "it no longer counts against the team"
    );
    // Its id may be used again, swept or not.
    let again = create(&mut c, "b-late", "t").await.unwrap();
    assert_eq!(status(&again), BuildStatus::Waiting);
    assert_eq!(get_build(&mut c, "b-late", "t").await.unwrap(), again);
}

on_both_stores!(
    a_build_made_through_one_replica_is_run_and_read_through_another,
    of_several_gateways_claiming_one_build_exactly_one_wins,
    a_build_whose_lease_runs_out_fails_cleanly_and_is_not_taken_over,
    a_build_log_is_bounded_per_build_and_per_team,
    builds_held_are_bounded_per_team_and_in_all,
    a_building_build_keeps_the_uploads_it_reads,
    a_build_never_claimed_is_gone_at_its_start_deadline,
);
