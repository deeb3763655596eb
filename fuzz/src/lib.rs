//! Fuzz targets for every warren parser that reads outside bytes
//! (docs/simulation.md, "Fuzzing").
//!
//! Each target is a plain function here, so the same code runs under
//! libFuzzer (`fuzz_targets/*.rs`, built by `cargo fuzz` with the
//! `libfuzzer` feature: `scripts/fuzz`) and in the corpus replay
//! (`tests/replay.rs`, an ordinary `cargo test -p warren-fuzz` that CI
//! runs over `corpus/<target>/` and `regressions/<target>/`).
//!
//! A target fails by panicking: the parsers themselves must never panic
//! on any input ("Nothing lost on bad input"), and where a parser makes a
//! promise about what it accepts, the target asserts it (an accepted
//! sandbox target names a valid id; a resolved path stays in its root; a
//! signed link verifies only for what it was signed for).
//!
//! # Layout
//! - [`TARGETS`]: name → function, for the replay and `scripts/fuzz`.
//! - one function per target, each saying how it reads its input.

use bytes::{Bytes, BytesMut};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A fuzz target: panics when its parser does something it must not.
pub type Target = fn(&[u8]);

/// Every target, by the name `cargo fuzz` knows it by.
pub const TARGETS: &[(&str, Target)] = &[
    ("sandbox_target", sandbox_target),
    ("e2b_json", e2b_json),
    ("build_steps", build_steps),
    ("connect_envelope", connect_envelope),
    ("multipart", multipart),
    ("template_spec", template_spec),
    ("signed_url", signed_url),
    ("envd_path", envd_path),
];

/// The input's text fields, split at newlines (which no header value, host
/// or URL can hold anyway), lossily decoded.
fn fields(data: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(data)
        .split('\n')
        .map(str::to_string)
        .collect()
}

/// Sandbox host and target parsing and the E2B routing headers (the
/// gateway's `target::classify`), and control-plane paths.
///
/// Input: a flags byte, then `host \n E2b-Sandbox-Id \n E2b-Sandbox-Port
/// \n request-target`. Flag bit 0 sends the id header, bit 1 the port
/// header, bit 2 puts the host in an absolute-form request target.
pub fn sandbox_target(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let f = fields(rest);
    let get = |i: usize| f.get(i).map(String::as_str).unwrap_or("");
    let (host, id, port, path) = (get(0), get(1), get(2), get(3));
    let uri = if flags & 4 != 0 {
        format!("http://{host}{path}")
    } else {
        path.to_string()
    };
    let mut req = http::Request::builder();
    req = match uri.parse::<http::Uri>() {
        Ok(u) => req.uri(u),
        Err(_) => req.uri("/"),
    };
    if let Ok(v) = http::HeaderValue::from_bytes(host.as_bytes()) {
        req = req.header(http::header::HOST, v);
    }
    for (bit, name, value) in [
        (1, warren_core::headers::E2B_SANDBOX_ID, id),
        (2, warren_core::headers::E2B_SANDBOX_PORT, port),
    ] {
        if flags & bit != 0 {
            if let Ok(v) = http::HeaderValue::from_bytes(value.as_bytes()) {
                req = req.header(name, v);
            }
        }
    }
    let Ok(req) = req.body(()) else {
        return;
    };
    if let Some(Ok(target)) = warren_gateway::target::classify(&req, "warren.test") {
        // What the data plane goes on to route is always a valid id and a
        // real port: nothing else reaches the scheduler or a node.
        assert!(
            warren_core::id::validate_sandbox_id(&target.sandbox_id).is_ok(),
            "classify accepted sandbox id {:?}",
            target.sandbox_id
        );
        assert!(target.port > 0, "classify accepted port 0");
    }
    let _ = warren_gateway::fuzzing::endpoint(req.uri().path());
}

/// The E2B JSON bodies and query values the gateway reads: `NewSandbox`,
/// the network update, timeouts, forks, snapshots, template records
/// (imports), names and tags, the `metadata` filter and `startedAfter`.
///
/// Input: a selector byte, then the body.
pub fn e2b_json(data: &[u8]) {
    use warren_gateway::models::{ForkRequest, NetworkUpdate, NewSandbox, Timeout};
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(body);
    match which % 10 {
        0 => {
            if let Ok(new) = NewSandbox::parse(body, 300) {
                // An accepted create never carries env vars the node
                // would refuse, nor an empty template.
                assert!(warren_core::env::check_vars(&new.env_vars).is_ok());
                assert!(!new.template_id.trim().is_empty());
            }
        }
        1 => drop(NetworkUpdate::parse(body)),
        2 => drop(Timeout::parse(body, true)),
        3 => drop(Timeout::parse(body, false)),
        4 => {
            if let Ok(fork) = ForkRequest::parse(body) {
                assert!(fork.count >= 1);
            }
        }
        5 => drop(warren_gateway::fuzzing::snapshot_request(body)),
        6 => {
            if let Ok(records) = serde_json::from_slice::<Vec<warren_template::Template>>(body) {
                for t in &records {
                    let _ = warren_template::validate_name(&t.name);
                }
            }
        }
        7 => drop(warren_gateway::models::parse_metadata_filter(&text)),
        8 => drop(warren_gateway::fuzzing::started_after(&text)),
        _ => drop(warren_gateway::fuzzing::template_name(&text)),
    }
}

/// A template build's steps (E2B's `TemplateBuildStartV2`: the steps the
/// SDK derives from a Dockerfile or its builder), as the build handler
/// checks them.
pub fn build_steps(data: &[u8]) {
    if let Ok(lines) = warren_gateway::fuzzing::build_steps(data) {
        for line in lines {
            assert!(!line.is_empty());
        }
    }
}

/// Connect envelope frames and the envd RPC messages in them: each
/// complete envelope (5-byte header, at most 1 MiB, envd's limit) is
/// decompressed when flagged (gzip, under the same limit) and decoded as
/// every request message of envd's process and filesystem services, in
/// the binary and the JSON codec.
pub fn connect_envelope(data: &[u8]) {
    use connectrpc::codec::{decode_json, decode_proto};
    use warren_envd_proto::{filesystem as fs, process as pr};
    const LIMIT: usize = 1 << 20;
    static GZIP: OnceLock<connectrpc::compression::CompressionRegistry> = OnceLock::new();
    let gzip = GZIP.get_or_init(|| {
        connectrpc::compression::CompressionRegistry::new()
            .register(connectrpc::compression::GzipProvider::new())
    });
    let mut buf = BytesMut::from(data);
    while let Ok(Some(envelope)) =
        connectrpc::envelope::Envelope::decode_with_limit(&mut buf, LIMIT)
    {
        let payload = if envelope.flags & 1 != 0 {
            match gzip.decompress_with_limit("gzip", envelope.data.clone(), LIMIT) {
                Ok(p) => p,
                Err(_) => continue,
            }
        } else {
            envelope.data.clone()
        };
        let p = &payload[..];
        macro_rules! decode_all {
            ($($m:ty),* $(,)?) => {$(
                let _ = decode_proto::<$m>(p);
                let _ = decode_json::<$m>(p);
            )*};
        }
        decode_all!(
            pr::StartRequest,
            pr::ConnectRequest,
            pr::ListRequest,
            pr::UpdateRequest,
            pr::SendInputRequest,
            pr::StreamInputRequest,
            pr::SendSignalRequest,
            pr::CloseStdinRequest,
            fs::StatRequest,
            fs::MakeDirRequest,
            fs::MoveRequest,
            fs::ListDirRequest,
            fs::RemoveRequest,
            fs::WatchDirRequest,
            fs::CreateWatcherRequest,
            fs::GetWatcherEventsRequest,
            fs::RemoveWatcherRequest,
        );
    }
}

/// A scratch sandbox root for the targets that write, with an `outside`
/// directory beside it that symlinks in the root point to: nothing may
/// ever appear there.
struct Scratch {
    /// Kept so the directory lives as long as the process.
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let base = dir.path().canonicalize().expect("canonical scratch");
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("home/user")).expect("root");
        std::fs::create_dir_all(&outside).expect("outside");
        // Links a tenant could have made: relative and absolute ways out.
        let _ = std::os::unix::fs::symlink("../outside", root.join("up"));
        let _ = std::os::unix::fs::symlink(&outside, root.join("abs"));
        let _ = std::os::unix::fs::symlink("/", root.join("slash"));
        let _ = std::os::unix::fs::symlink("home/user", root.join("rel"));
        Scratch {
            _dir: dir,
            root,
            outside,
        }
    })
}

/// Removes what a run wrote into the scratch root (the links stay).
fn reset(s: &Scratch) {
    if let Ok(entries) = std::fs::read_dir(&s.root) {
        for e in entries.flatten() {
            let name = e.file_name();
            if ["up", "abs", "slash", "rel", "home"].contains(&name.to_string_lossy().as_ref()) {
                continue;
            }
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(&p);
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    let home = s.root.join("home");
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::create_dir_all(home.join("user"));
}

fn assert_nothing_outside(s: &Scratch, what: &str) {
    let found: Vec<_> = std::fs::read_dir(&s.outside)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(found.is_empty(), "{what} wrote outside the root: {found:?}");
}

/// envd's `multipart/form-data` upload (`POST /files`): the parts, their
/// names and file names as destinations, into a scratch root with
/// symlinks pointing out of it.
///
/// Input: `content-type \n query \n body`; the body is fed in chunks cut
/// at every `0xff` byte (multer must cope with any split).
pub fn multipart(data: &[u8]) {
    let mut it = data.splitn(3, |b| *b == b'\n');
    let content_type = String::from_utf8_lossy(it.next().unwrap_or_default()).into_owned();
    let query = String::from_utf8_lossy(it.next().unwrap_or_default()).into_owned();
    let body: Vec<Bytes> = it
        .next()
        .unwrap_or_default()
        .split(|b| *b == 0xff)
        .map(Bytes::copy_from_slice)
        .collect();
    let s = scratch();
    let jail = warren_envd::paths::Jail::new(s.root.clone(), "/home/user".into());
    let rt = runtime();
    let (status, written) = rt.block_on(warren_envd::files::fuzz_multipart(
        &jail,
        Some(&query),
        &content_type,
        body,
    ));
    if status.is_success() {
        assert!(!written.is_empty(), "a 200 upload wrote nothing");
    }
    assert_nothing_outside(s, "a multipart upload");
    reset(s);
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// The template build file (TOML: `warren template build`), as read from
/// an operator's file.
pub fn template_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = warren_template::Spec::parse(text);
}

/// Signed-URL parameters: the gateway's COPY upload links
/// (`?team=&expires=&signature=`) and envd's presigned `/files` URLs
/// (`?path=&username=&signature=&signature_expiration=`).
///
/// Input: a selector byte, then `hash \n query` (gateway) or `method \n
/// query` (envd). A link the gateway made verifies for its own team; one
/// edited anywhere does not.
pub fn signed_url(data: &[u8]) {
    const KEY: &[u8] = b"fuzz-upload-key";
    const NOW: u64 = 1_800_000_000;
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let f = fields(rest);
    let get = |i: usize| f.get(i).map(String::as_str).unwrap_or("");
    if which % 2 == 0 {
        let (hash, query) = (get(0), get(1));
        if let Ok(team) = warren_gateway::fuzzing::upload_link(KEY, hash, query, NOW) {
            // Accepted: the same link, made afresh for that team, hash and
            // an expiry, must be what the query says (the MAC binds all three).
            let expires = form_pairs(query, "expires")
                .and_then(|e| e.parse::<u64>().ok())
                .expect("an accepted link has an expiry");
            assert!(expires >= NOW, "an expired link was accepted");
            let made =
                warren_gateway::fuzzing::upload_query(KEY, &team, hash, expires).expect("a link");
            assert_eq!(
                form_pairs(&made, "signature").map(|s| s.to_ascii_lowercase()),
                form_pairs(query, "signature").map(|s| s.to_ascii_lowercase()),
                "a link verified with a signature the gateway would not make"
            );
        }
        // Round trip: a made link verifies for its team, until it expires.
        let team = get(2);
        if let Ok(made) = warren_gateway::fuzzing::upload_query(KEY, team, hash, NOW + 60) {
            let checked = warren_gateway::fuzzing::upload_link(KEY, hash, &made, NOW);
            if warren_gateway::fuzzing::upload_link(KEY, hash, "", NOW)
                .is_err_and(|e| e.status == http::StatusCode::BAD_REQUEST)
            {
                // A malformed hash is refused before any signature.
                assert!(checked.is_err());
            } else {
                assert_eq!(checked.ok().as_deref(), Some(team));
                assert!(warren_gateway::fuzzing::upload_link(KEY, hash, &made, NOW + 61).is_err());
            }
        }
    } else {
        let method = if get(0) == "GET" {
            http::Method::GET
        } else {
            http::Method::POST
        };
        let q = warren_envd::files::Query::parse(Some(get(1)));
        let _ = warren_envd::files::check_signature(&q, &method, "fuzz-access-token");
    }
}

/// The first value of `key` in a URL query.
fn form_pairs(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

/// envd's path confinement (`paths::Jail::resolve`), on every path a
/// request can name: whatever the path, what it resolves to is inside the
/// root, through the root's relative and absolute symlinks too.
///
/// Input: a flags byte (bit 0: follow the last link), then the path.
pub fn envd_path(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let path = String::from_utf8_lossy(rest);
    let s = scratch();
    let jail = warren_envd::paths::Jail::new(s.root.clone(), "/home/user".into());
    let follow = if flags & 1 != 0 {
        warren_envd::paths::Follow::All
    } else {
        warren_envd::paths::Follow::NotLast
    };
    if let Ok(r) = jail.resolve(&path, follow) {
        assert!(
            inside(&r.host, &s.root),
            "{path:?} resolved to {} outside the root",
            r.host.display()
        );
        assert!(r.client.starts_with('/'), "client path {:?}", r.client);
    }
}

/// Whether `p` is `root` or below it, by components (no `..` left).
fn inside(p: &Path, root: &Path) -> bool {
    p.starts_with(root)
        && !p
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
}
