//! `warren scheduler|gateway|node ... --check-config`: a part's whole
//! configuration checked as a start checks it, nothing bound, dialed or
//! made (docs/deploy.md, "Checking a configuration"). A good configuration
//! exits 0 even where a start could not bind its port or reach its
//! database; a bad one exits 64 with the very line the start prints.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use warren_trust::issue::{file_base, Ca, Validity};
use warren_trust::{Identity, Role};

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// A directory with a CA and certificates for a scheduler `s1`, a gateway
/// `gw` and a node `n1`, an API-key file, a store key and an upload key.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::load_or_create(dir.path(), Validity::days(1)).expect("CA");
        for (role, name) in [
            (Role::Scheduler, "s1"),
            (Role::Gateway, "gw"),
            (Role::Node, "n1"),
        ] {
            let id = Identity::new(role, name).expect("identity");
            ca.issue(&id, &["127.0.0.1".into()], Validity::days(1))
                .and_then(|c| c.save(dir.path(), &file_base(&id)))
                .expect("certificate");
        }
        let f = Files { dir };
        warren_core::private::write(&f.path("api-keys"), b"key-1 team-a\n").expect("keys");
        warren_core::private::write(&f.path("store.key"), "ab".repeat(32).as_bytes())
            .expect("store key");
        warren_core::private::write(&f.path("upload.key"), &[b'u'; 40]).expect("upload key");
        f
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn s(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// `--tls-ca`, `--tls-cert`, `--tls-key` for `role-name`.
    fn tls(&self, base: &str) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.s("ca.pem"),
            "--tls-cert".into(),
            self.s(&format!("{base}.pem")),
            "--tls-key".into(),
            self.s(&format!("{base}.key")),
        ]
    }
}

/// `warren <args>` with `env` (and nothing of this process's WARREN_*).
fn warren(args: &[String], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("WARREN_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run warren")
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The last line of what a process wrote to stderr.
fn last_line(o: &Output) -> String {
    text(&o.stderr)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// The scheduler's arguments on PostgreSQL at a port nothing listens on,
/// its gRPC port one that is taken: a start fails, a check passes.
fn scheduler_args(f: &Files, taken: u16) -> Vec<String> {
    let mut a = strings(&[
        "scheduler",
        "--listen",
        &format!("127.0.0.1:{taken}"),
        "--database-url",
        "postgres://warren@127.0.0.1:1/warren",
        "--store-key-file",
        &f.s("store.key"),
    ]);
    a.extend(f.tls("scheduler-s1"));
    a
}

#[test]
fn good_configurations_pass_without_binding_or_dialing() {
    let f = Files::new();
    // Held for the whole test: a start on this port could not bind it.
    let held = TcpListener::bind("127.0.0.1:0").expect("a port");
    let taken = held.local_addr().expect("addr").port();

    let mut args = scheduler_args(&f, taken);
    args.push("--check-config".into());
    let report = ok(&warren(&args, &[]));
    assert!(
        report.contains("the configuration is valid")
            && report.contains("postgres://warren@127.0.0.1:1/warren")
            && report.contains(&format!("127.0.0.1:{taken} (not bound)"))
            && report.contains("as scheduler \"s1\""),
        "{report}"
    );
    // The port is still this test's: nothing was bound.
    assert!(TcpListener::bind(("127.0.0.1", taken)).is_err());

    // The same line started for real cannot bind: the check told nothing
    // a start needs that it did not have, and the start fails elsewhere.
    args.pop();
    let start = warren(&args, &[]);
    assert!(!start.status.success());
    assert!(last_line(&start).contains("cannot listen"), "{start:?}");

    // The gateway: API keys from the environment, a scheduler nothing
    // answers at, a blob store on S3 (opened, not contacted).
    let mut gw = strings(&[
        "gateway",
        "--listen",
        &format!("127.0.0.1:{taken}"),
        "--scheduler",
        "127.0.0.1:1,127.0.0.1:2",
        "--api-keys-file",
        &f.s("api-keys"),
        "--build-upload-key-file",
        &f.s("upload.key"),
        "--blob-store",
        "s3://bucket/prefix",
        "--blob-store-option",
        "endpoint=http://127.0.0.1:1",
        "--blob-store-option",
        "region=garage",
        "--blob-store-option",
        "allow_http=true",
        "--domain",
        "sandbox.example.com",
        "--check-config",
    ]);
    gw.extend(f.tls("gateway-gw"));
    let report = ok(&warren(
        &gw,
        &[
            ("WARREN_GATEWAY_API_KEY", "key-2:team-b"),
            ("AWS_ACCESS_KEY_ID", "id"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    ));
    assert!(
        report.contains("API keys: 2")
            && report.contains("http://127.0.0.1:1, http://127.0.0.1:2 (not dialed)")
            && report.contains("s3://bucket/prefix"),
        "{report}"
    );

    // The node, its settings from a TOML file; its data dir is not made.
    let toml = f.path("node.toml");
    let data = f.path("node-data");
    std::fs::write(
        &toml,
        format!(
            "node-id = \"n1\"\nlisten = \"127.0.0.1:{taken}\"\ndata-dir = \"{}\"\n\
             tls-ca = \"{}\"\ntls-cert = \"{}\"\ntls-key = \"{}\"\n",
            data.display(),
            f.s("ca.pem"),
            f.s("node-n1.pem"),
            f.s("node-n1.key")
        ),
    )
    .expect("toml");
    let report = ok(&warren(
        &strings(&["node", "--config", &f.s("node.toml"), "--check-config"]),
        &[],
    ));
    assert!(
        report.contains("node id: n1") && report.contains("as node \"n1\""),
        "{report}"
    );
    assert!(!data.exists(), "a check made the data dir");
    drop(held);
}

/// A bad configuration: what it is, the arguments, the environment, and a
/// piece of the message.
type Case<'a> = (&'a str, Vec<String>, Vec<(&'a str, &'a str)>, &'a str);

/// Each bad configuration: the check and the start exit 64 with the same
/// message, word for word, and the start announces no listener (it stops
/// before binding, as the check does).
#[test]
fn bad_configurations_fail_as_a_start_fails() {
    let f = Files::new();
    // Starts here bind free ports: a bad configuration must stop them
    // before anything is bound or dialed anyway.
    let port = warren_test_support::free_port();
    let base = scheduler_args(&f, port);
    let wide = f.path("wide.key");
    std::fs::write(&wide, "ab".repeat(32)).expect("key");
    std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let unknown_toml = f.path("unknown.toml");
    std::fs::write(&unknown_toml, "listen = \"127.0.0.1:1\"\nlisteen = 2\n").expect("toml");

    let with = |extra: &[&str]| {
        let mut a = base.clone();
        a.extend(strings(extra));
        a
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "a gateway's certificate for the scheduler",
            with(&[
                "--tls-cert",
                &f.s("gateway-gw.pem"),
                "--tls-key",
                &f.s("gateway-gw.key"),
            ]),
            vec![],
            "but this is a scheduler",
        ),
        (
            "a key and certificate that do not belong together",
            with(&["--tls-key", &f.s("node-n1.key")]),
            vec![],
            "do not belong together",
        ),
        (
            "a store key other accounts can read",
            with(&["--store-key-file", &wide.display().to_string()]),
            vec![],
            "chmod 600",
        ),
        (
            "a bad duration in the environment",
            base.clone(),
            vec![("WARREN_SCHEDULER_LEASE", "soon")],
            "soon",
        ),
        (
            "an unknown key in the file",
            with(&["--config", &unknown_toml.display().to_string()]),
            vec![],
            "unknown setting \"listeen\"",
        ),
        (
            "a password on the command line",
            with(&["--database-url", "postgres://warren:pw@127.0.0.1:1/warren"]),
            vec![],
            "WARREN_SCHEDULER_DATABASE_URL",
        ),
        (
            "no store key with PostgreSQL",
            base.iter()
                .filter(|a| !a.ends_with("store.key") && *a != "--store-key-file")
                .cloned()
                .collect(),
            vec![],
            "--store-key-file is required",
        ),
        (
            "an unsupported store URL",
            with(&["--database-url", "mysql://db/warren"]),
            vec![],
            "unsupported scheme",
        ),
    ];
    let gw = |extra: &[&str]| {
        let mut a = strings(&[
            "gateway",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--scheduler",
            "127.0.0.1:1",
            "--api-keys-file",
            &f.s("api-keys"),
        ]);
        a.extend(f.tls("gateway-gw"));
        a.extend(strings(extra));
        a
    };
    let gateway_cases: Vec<Case<'_>> = vec![
        (
            "an API key on the command line",
            gw(&["--api-key", "k:t"]),
            vec![],
            "--api-key on the command line",
        ),
        (
            "a blob store option holding a secret",
            gw(&[
                "--blob-store",
                "s3://b",
                "--blob-store-option",
                "secret_access_key=x",
            ]),
            vec![],
            "--blob-store-option",
        ),
        (
            "a public TLS key that is not the certificate's",
            gw(&[
                "--public-tls-listen",
                "127.0.0.1:0",
                "--public-tls-cert",
                &f.s("gateway-gw.pem"),
                "--public-tls-key",
                &f.s("node-n1.key"),
            ]),
            vec![],
            "--public-tls-cert/--public-tls-key",
        ),
        (
            "a scheduler URL of another scheme",
            gw(&["--scheduler", "ftp://x:1"]),
            vec![],
            "--scheduler",
        ),
    ];
    let node_cases: Vec<Case<'_>> = vec![(
        "a node certificate naming another node",
        {
            let mut a = strings(&[
                "node",
                "--node-id",
                "n2",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                &f.s("node-data"),
            ]);
            a.extend(f.tls("node-n1"));
            a
        },
        vec![],
        "but this node is \"n2\"",
    )];
    for (what, args, env, expect) in cases.into_iter().chain(gateway_cases).chain(node_cases) {
        let mut check = args.clone();
        check.push("--check-config".into());
        let checked = warren(&check, &env);
        let started = warren(&args, &env);
        assert_eq!(checked.status.code(), Some(64), "{what}: {checked:?}");
        assert_eq!(started.status.code(), Some(64), "{what}: {started:?}");
        // The whole of what each wrote: the start's message, word for word.
        let said = text(&checked.stderr);
        assert!(said.contains(expect), "{what}: {said}");
        assert_eq!(
            said,
            text(&started.stderr),
            "{what}: not the start's message"
        );
        assert!(
            started.stdout.is_empty(),
            "{what}: the start bound something"
        );
        assert!(
            checked.stdout.is_empty(),
            "{what}: a failed check printed a report"
        );
    }
    assert!(!f.path("node-data").exists(), "a node made its data dir");
}

/// The switch is the command line's only: not a TOML key, not a variable
/// (a check-only switch left in an environment would keep a part from
/// ever starting), and not taken by the operator commands.
#[test]
fn the_switch_is_only_a_flag_of_the_parts() {
    let f = Files::new();
    let toml = f.path("check.toml");
    std::fs::write(&toml, "check-config = true\n").expect("toml");
    let o = warren(
        &strings(&["scheduler", "--config", &f.s("check.toml")]),
        &[],
    );
    assert_eq!(o.status.code(), Some(64));
    assert!(
        last_line(&o).contains("unknown setting \"check-config\""),
        "{o:?}"
    );
    let o = warren(&strings(&["dev", "--check-config"]), &[]);
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    assert!(text(&o.stderr).contains("--check-config"), "{o:?}");
}
