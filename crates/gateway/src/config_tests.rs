//! `Config`'s flags and their checks: defaults, env names, refusals.

#![allow(clippy::unwrap_used)]
use super::*;
use clap::Parser;

fn parse(args: &[&str]) -> Config {
    Config::try_parse_from(std::iter::once("gw").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn needs_an_api_key() {
    let err = parse(&[]).validate().unwrap_err();
    assert!(err.to_string().contains("no API keys"), "{err}");
    let ok = parse(&["--api-key", "k1:team-a", "--api-key", "k2:team-b"])
        .validate()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ok.api_keys.team("k2"), Some("team-b"));
    assert_eq!(ok.api_keys.team("nope"), None);
}

#[test]
fn rejects_bad_values() {
    let err = parse(&["--api-key", "nocolon"]).validate().unwrap_err();
    assert!(err.to_string().contains("KEY:TEAM"), "{err}");
    let err = parse(&["--api-key", "k:t", "--domain", "bad domain"])
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("--domain"), "{err}");
    let err = parse(&["--api-key", "k:t", "--scheduler", "ftp://x"])
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("--scheduler"), "{err}");
    let err = parse(&["--api-key", "k:t", "--build-upload-max-bytes", "0"])
        .validate()
        .unwrap_err();
    assert!(
        err.to_string().contains("--build-upload-max-bytes"),
        "{err}"
    );
    let err = parse(&[
        "--api-key",
        "k:t",
        "--build-upload-max-bytes",
        "100",
        "--build-upload-total-bytes",
        "99",
    ])
    .validate()
    .unwrap_err();
    assert!(
        err.to_string().contains("--build-upload-total-bytes"),
        "{err}"
    );
    for team in ["99", "5000"] {
        let err = parse(&[
            "--api-key",
            "k:t",
            "--build-upload-max-bytes",
            "100",
            "--build-upload-total-bytes",
            "1000",
            "--build-upload-team-bytes",
            team,
        ])
        .validate()
        .unwrap_err();
        assert!(
            err.to_string().contains("--build-upload-team-bytes"),
            "{err}"
        );
    }
    let err = parse(&["--api-key", "k:t", "--dead-node-timeout", "500ms"])
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("--dead-node-timeout"), "{err}");
    let s = parse(&["--api-key", "k:t"]).validate().unwrap();
    assert_eq!(s.dead_node_timeout, Duration::from_secs(10));
    assert_eq!(s.uploads.team_bytes, 1024 * 1024 * 1024);
    assert_eq!(s.uploads.max_bytes, 512 * 1024 * 1024);
    assert_eq!(s.uploads.dir, s.template_dir.join("uploads"));
    assert_eq!(s.uploads.key, None);
}

#[test]
fn api_keys_are_refused_on_the_command_line() {
    for args in [
        &["gateway", "--api-key", "k:t"][..],
        &["gateway", "--listen", "127.0.0.1:1", "--api-key=k:t"],
    ] {
        let err = refuse_secrets_in_args(args).unwrap_err().to_string();
        assert!(
            err.contains("--api-keys-file") && err.contains("WARREN_GATEWAY_API_KEY"),
            "{err}"
        );
    }
    for args in [
        &["gateway", "--api-keys-file", "/etc/warren/keys"][..],
        &["gateway", "--admin-team", "ops"],
    ] {
        assert!(refuse_secrets_in_args(args).is_ok(), "{args:?}");
    }
}

#[test]
fn route_cache_settings() {
    let s = parse(&["--api-key", "k:t"])
        .validate()
        .unwrap_or_else(|e| panic!("{e}"));
    let cache = s.route_cache.unwrap();
    assert_eq!(cache.capacity, 100_000);
    assert_eq!(cache.ttl, Duration::from_secs(30));
    assert!(cache.watch);
    assert_eq!(s.retry_max_body, 64 * 1024);

    let s = parse(&[
        "--api-key",
        "k:t",
        "--route-cache-ttl",
        "1h",
        "--route-cache-watch",
        "false",
    ])
    .validate()
    .unwrap_or_else(|e| panic!("{e}"));
    let cache = s.route_cache.unwrap();
    assert_eq!(cache.ttl, Duration::from_secs(3600));
    assert!(!cache.watch);

    // 0 turns the cache off entirely (and then the TTL does not matter).
    let s = parse(&["--api-key", "k:t", "--route-cache-capacity", "0"])
        .validate()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(s.route_cache.is_none());
    let err = parse(&["--api-key", "k:t", "--route-cache-ttl", "0s"])
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("--route-cache-ttl"), "{err}");
}

#[test]
fn listener_limits() {
    let s = parse(&["--api-key", "k:t"])
        .validate()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.listener.header_read_timeout, Limits::HEADER_READ_TIMEOUT);
    assert_eq!(s.listener.idle_timeout, Duration::from_secs(360));
    assert_eq!(
        s.listener.body_progress_timeout,
        Limits::BODY_PROGRESS_TIMEOUT
    );
    assert_eq!(s.listener.max_connections, 10_000);
    assert_eq!(s.listener.max_connections_per_peer, Some(1_000));
    assert_eq!(
        s.admin_listener.max_connections,
        Limits::ADMIN_MAX_CONNECTIONS
    );
    assert_eq!(s.admin_listener.max_connections_per_peer, None);

    let s = parse(&["--api-key", "k:t", "--max-connections-per-peer", "0"])
        .validate()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.listener.max_connections_per_peer, None);
    let err = parse(&["--api-key", "k:t", "--header-read-timeout", "0s"])
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("--header-read-timeout"), "{err}");

    // The TOML keys are the flag names.
    let dir = std::env::temp_dir().join(format!("warren-gw-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("gateway.toml");
    std::fs::write(
        &file,
        "api-key = [\"k:t\"]\nmax-connections = 300\nmax-connections-per-peer = 20\n\
         idle-timeout = \"5m\"\nbody-progress-timeout = \"2s\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let args = ["gw"].map(std::ffi::OsString::from);
    let config: Config =
        warren_core::config::load_from(args, Some(&file)).unwrap_or_else(|e| panic!("{e}"));
    let s = config.validate().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.listener.max_connections, 300);
    assert_eq!(s.listener.max_connections_per_peer, Some(20));
    assert_eq!(s.listener.idle_timeout, Duration::from_secs(300));
    assert_eq!(s.listener.body_progress_timeout, Duration::from_secs(2));
    assert_eq!(s.admin_listener.idle_timeout, Duration::from_secs(300));
}

#[test]
fn public_tls_flags() {
    // Off by default.
    let s = parse(&["--api-key", "k:t"]).validate().unwrap();
    assert!(s.public_tls.is_none());

    // All three or none.
    for args in [
        &["--public-tls-listen", "127.0.0.1:443"][..],
        &["--public-tls-cert", "c.pem", "--public-tls-key", "k.pem"][..],
        &[
            "--public-tls-listen",
            "127.0.0.1:443",
            "--public-tls-cert",
            "c.pem",
        ][..],
    ] {
        let mut all = vec!["--api-key", "k:t"];
        all.extend_from_slice(args);
        let err = parse(&all).validate().unwrap_err();
        assert!(err.to_string().contains("go together"), "{args:?}: {err}");
    }

    // Files that are not there are named, with the flag.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem").display().to_string();
    let err = parse(&[
        "--api-key",
        "k:t",
        "--public-tls-listen",
        "127.0.0.1:443,[::1]:443",
        "--public-tls-cert",
        &missing,
        "--public-tls-key",
        &missing,
    ])
    .validate()
    .unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("--public-tls-cert") && err.contains("nope.pem"),
        "{err}"
    );

    // A key file in place of the certificate.
    let key = dir.path().join("only.key");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let key = key.display().to_string();
    let err = parse(&[
        "--api-key",
        "k:t",
        "--public-tls-listen",
        "127.0.0.1:443",
        "--public-tls-cert",
        &key,
        "--public-tls-key",
        &key,
    ])
    .validate()
    .unwrap_err();
    assert!(err.to_string().contains("no certificate"), "{err}");
}

#[test]
fn scheduler_list_and_keys_file() {
    let dir = std::env::temp_dir().join(format!("warren-gw-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("keys");
    std::fs::write(&file, "# comment\nkey1 team1\n\nkey2 team2 # trailing\n")
        .unwrap_or_else(|e| panic!("{e}"));
    {
        use std::os::unix::fs::PermissionsExt;
        let keys = file.to_str().unwrap_or_default();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = parse(&["--api-keys-file", keys]).validate().unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let s = parse(&[
        "--scheduler",
        "127.0.0.1:1,http://127.0.0.1:2",
        "--api-keys-file",
        file.to_str().unwrap_or_default(),
    ])
    .validate()
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.schedulers, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
    assert_eq!(s.api_keys.team("key2"), Some("team2"));
}
