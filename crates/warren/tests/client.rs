//! `warren-client` against real processes with two gateways: a command stream survives `kill -9` of the gateway it runs
//! through, and a create retried through the second gateway yields exactly
//! one sandbox.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use std::time::Duration;
use warren_client::{ClientBuilder, Command, NewSandbox, StreamEvent};
use warren_test_support::cluster::{Cluster, Spec};

const KEY: &str = "key-team-a";

fn bin() -> &'static std::path::Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

async fn cluster() -> Cluster {
    let spec = Spec {
        nodes: 1,
        gateways: 2,
        ..Spec::default()
    };
    Cluster::start(bin(), spec).await.expect("cluster starts")
}

/// `line 1\n` … `line n\n`.
fn numbered(n: u32) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_stream_resumes_through_the_other_gateway_after_kill_9() {
    let mut c = cluster().await;
    let gws = [c.gateway(0), c.gateway(1)];
    let client = ClientBuilder::new(&gws)
        .api_key(KEY)
        .backoff(Duration::from_millis(50))
        .build()
        .expect("client");
    let sandbox = client
        .create(&NewSandbox::base(300), "stream-sandbox")
        .await
        .expect("create")
        .sandbox;

    // 1500 numbered lines, a little at a time, so the kill lands mid-output.
    const LINES: u32 = 1500;
    let script = format!(
        "i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo \"line $i\"; \
         if [ $((i % 50)) = 0 ]; then sleep 0.05; fi; done"
    );
    // A fresh client's first call goes through its first entry point: gateway 0.
    let streamer = ClientBuilder::new(&gws)
        .api_key(KEY)
        .backoff(Duration::from_millis(50))
        .build()
        .expect("client");
    let mut stream = streamer
        .run(&sandbox, Command::shell(script))
        .await
        .expect("start");
    let mut out = Vec::new();
    let mut pid = None;
    while !String::from_utf8_lossy(&out).contains("line 200\n") {
        match stream.next().await.expect("stream before the kill") {
            Some(StreamEvent::Stdout(b)) => out.extend(b),
            Some(StreamEvent::Started { pid: p }) => pid = Some(p),
            Some(StreamEvent::End(e)) => panic!("ended before the kill: {e:?}"),
            Some(other) => panic!("unexpected before the kill: {other:?}"),
            None => panic!("stream closed before the kill"),
        }
    }
    let pid = pid.expect("a start event with the pid");
    c.gateways[0].kill9().await;

    let mut resumed_through = Vec::new();
    let mut exit = None;
    while let Some(ev) = stream.next().await.expect("the stream survives the kill") {
        match ev {
            StreamEvent::Stdout(b) => out.extend(b),
            StreamEvent::Stderr(b) => panic!("stderr: {}", String::from_utf8_lossy(&b)),
            StreamEvent::Resumed { entry, offset } => resumed_through.push((entry, offset)),
            StreamEvent::End(e) => exit = Some(e),
            StreamEvent::Started { pid: p } => panic!("a second start event (pid {p})"),
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&out),
        numbered(LINES),
        "the assembled output is the whole sequence, in order, once"
    );
    assert_eq!(exit.map(|e| e.exit_code), Some(0));
    assert!(
        !resumed_through.is_empty() && resumed_through.iter().all(|(e, _)| *e == gws[1]),
        "resumed through the surviving gateway: {resumed_through:?}"
    );
    assert_eq!(stream.pid(), Some(pid), "the same process, never re-run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retried_through_the_second_gateway_yields_one_sandbox() {
    let mut c = cluster().await;
    let gws = [c.gateway(0), c.gateway(1)];
    let tagged = |key: &str| {
        let mut new = NewSandbox::base(300);
        new.metadata.insert("key".into(), key.into());
        new
    };
    let count = |list: &[warren_client::Sandbox], key: &str| {
        list.iter()
            .filter(|s| s.metadata.get("key").map(String::as_str) == Some(key))
            .count()
    };

    // Gateway 0 frozen mid-request: the first attempt gets no answer in
    // time, the retry goes through gateway 1 with the same key. When gateway
    // 0 wakes up and finishes the original request, it finds the same sandbox.
    let client = ClientBuilder::new(&gws)
        .api_key(KEY)
        .timeout(Duration::from_secs(2))
        .backoff(Duration::from_millis(50))
        .build()
        .expect("client");
    c.gateways[0].signal(nix::sys::signal::Signal::SIGSTOP);
    let created = client
        .create(&tagged("frozen"), "key-frozen")
        .await
        .expect("create through the second gateway");
    assert_eq!(created.attempts, 2, "{created:?}");
    assert_eq!(created.entry, gws[1]);
    c.gateways[0].signal(nix::sys::signal::Signal::SIGCONT);

    // Gateway 0 killed: the connection is refused, the retry goes through gateway 1.
    c.gateways[0].kill9().await;
    let first = client
        .create(&tagged("killed"), "key-killed")
        .await
        .expect("create after the kill");
    let again = client
        .create(&tagged("killed"), "key-killed")
        .await
        .expect("the same create again");
    assert_eq!(first.sandbox.sandbox_id, again.sandbox.sandbox_id);

    // Listing through the survivor: one sandbox per key, whatever the
    // frozen gateway did when it woke up before it was killed.
    let survivor = ClientBuilder::new(&[gws[1].clone()])
        .api_key(KEY)
        .build()
        .expect("client");
    let list = survivor.list().await.expect("list");
    assert_eq!(count(&list, "frozen"), 1, "{list:?}");
    assert_eq!(count(&list, "killed"), 1, "{list:?}");
    assert!(list
        .iter()
        .any(|s| s.sandbox_id == created.sandbox.sandbox_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_exec_runs_once_through_the_next_entry_point_when_the_first_is_dead() {
    let mut c = cluster().await;
    let gws = [c.gateway(0), c.gateway(1)];
    let client = ClientBuilder::new(&gws)
        .api_key(KEY)
        .build()
        .expect("client");
    let sandbox = client
        .create(&NewSandbox::base(300), "exec-sandbox")
        .await
        .expect("create")
        .sandbox;
    c.gateways[0].kill9().await;
    let out = tokio::process::Command::new(bin())
        .args([
            "sandbox",
            "--api-url",
            &format!("http://{}", gws[1]),
            "--sandbox-url",
            &format!("http://{},http://{}", gws[0], gws[1]),
            "exec",
            &sandbox.sandbox_id,
            "echo run >> $HOME/runs; cat $HOME/runs; echo oops >&2; exit 3",
        ])
        .env("E2B_API_KEY", KEY)
        .output()
        .await
        .expect("warren sandbox exec runs");
    assert_eq!(
        out.status.code(),
        Some(3),
        "the command's exit code; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "run\n",
        "ran exactly once"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("oops"));
}
