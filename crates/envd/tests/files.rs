//! `/files`, `filesystem.Filesystem`, the sandbox root boundary and the
//! access token.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

mod common;

use common::{TestEnvd, TOKEN};
use connectrpc::ErrorCode;
use http::StatusCode;
use rand::RngCore;
use std::io::Write;
use warren_envd_proto::filesystem::{
    FileType, ListDirRequest, MakeDirRequest, MoveRequest, RemoveRequest, StatRequest,
    WatchDirRequest,
};
use warren_envd_proto::process::{ListRequest, ProcessConfig, StartRequest};

fn random_bytes(n: usize) -> Vec<u8> {
    let mut data = vec![0u8; n];
    rand::rng().fill_bytes(&mut data);
    data
}

/// A multipart body as httpx (the e2b SDK) builds it: one `file` part per
/// file, the destination path as its file name.
fn multipart(files: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "warren-test-boundary-7d3f";
    let mut body = Vec::new();
    for (name, data) in files {
        write!(
            body,
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .expect("write");
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    write!(body, "--{boundary}--\r\n").expect("write");
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).expect("json body")
}

#[tokio::test]
async fn multipart_upload_then_download_is_byte_exact() {
    let envd = TestEnvd::start().await;
    let data = random_bytes(300 * 1024 + 7);
    let (ct, body) = multipart(&[("bin/data.bin", &data)]);
    let (status, _, res) = envd
        .http(
            "POST",
            "/files?username=user",
            &[("content-type", &ct)],
            body,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&res));
    let written = json(&res);
    assert_eq!(
        written[0]["path"], "/home/user/bin/data.bin",
        "relative paths start at home"
    );
    assert_eq!(written[0]["name"], "data.bin");
    assert_eq!(written[0]["type"], "file");
    assert_eq!(
        std::fs::read(envd.host("/home/user/bin/data.bin")).expect("on disk"),
        data
    );

    let (status, headers, got) = envd
        .http(
            "GET",
            "/files?path=%2Fhome%2Fuser%2Fbin%2Fdata.bin",
            &[],
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(got, data, "downloaded bytes equal uploaded bytes");

    // Several files in one request, each to its own path.
    let (ct, body) = multipart(&[("/tmp/a.txt", b"A"), ("b.txt", b"B")]);
    let (status, _, res) = envd
        .http("POST", "/files", &[("content-type", &ct)], body)
        .await;
    assert_eq!(status, StatusCode::OK);
    let written = json(&res);
    assert_eq!(written[0]["path"], "/tmp/a.txt");
    assert_eq!(written[1]["path"], "/home/user/b.txt");
    assert_eq!(std::fs::read(envd.host("/tmp/a.txt")).expect("a"), b"A");

    // With ?path=, the one part goes there whatever its file name.
    let (ct, body) = multipart(&[("ignored.txt", b"overwritten")]);
    let (status, _, _) = envd
        .http("POST", "/files?path=b.txt", &[("content-type", &ct)], body)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        std::fs::read(envd.host("/home/user/b.txt")).expect("b"),
        b"overwritten"
    );
}

#[tokio::test]
async fn octet_stream_and_gzip_uploads() {
    let envd = TestEnvd::start().await;
    let data = random_bytes(64 * 1024);
    let (status, _, res) = envd
        .http(
            "POST",
            "/files?path=raw.bin",
            &[("content-type", "application/octet-stream")],
            data.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&res));
    assert_eq!(json(&res)[0]["path"], "/home/user/raw.bin");
    assert_eq!(
        std::fs::read(envd.host("/home/user/raw.bin")).expect("raw"),
        data
    );

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&data).expect("gzip");
    let compressed = gz.finish().expect("gzip");
    let (status, _, _) = envd
        .http(
            "POST",
            "/files?path=gz.bin",
            &[
                ("content-type", "application/octet-stream"),
                ("content-encoding", "gzip"),
            ],
            compressed,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        std::fs::read(envd.host("/home/user/gz.bin")).expect("gz"),
        data
    );

    let (status, _, res) = envd
        .http(
            "POST",
            "/files?path=bad.bin",
            &[
                ("content-type", "application/octet-stream"),
                ("content-encoding", "gzip"),
            ],
            b"not gzip at all".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&res)["code"], 400);
}

#[tokio::test]
async fn download_errors_use_e2b_json() {
    let envd = TestEnvd::start().await;
    let (status, _, res) = envd
        .http("GET", "/files?path=missing.txt", &[], vec![])
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let err = json(&res);
    assert_eq!(err["code"], 404);
    assert!(err["message"]
        .as_str()
        .unwrap_or("")
        .contains("/home/user/missing.txt"));
    let (status, _, _) = envd.http("GET", "/files?path=/home", &[], vec![]).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a directory cannot be downloaded"
    );
    let (status, _, _) = envd.http("GET", "/files", &[], vec![]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "path is required");
}

/// Files of the kernel's pseudo-filesystems say they are empty (`/proc`)
/// or a page long (`/sys`): a download reads them to their end instead of
/// trusting that size. Devices and pipes, which have no end, are refused.
#[tokio::test]
async fn proc_files_download_with_their_content() {
    // This envd's root is the host's, so `/proc/self` is this test process.
    let envd = TestEnvd::start_with(|s| warren_envd::Settings {
        root: "/".into(),
        home: "/tmp".into(),
        ..s
    })
    .await;
    let (status, headers, body) = envd
        .http("GET", "/files?path=/proc/self/status", &[], vec![])
        .await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.starts_with("Name:") && text.contains("\nPid:\t"),
        "{text:?}"
    );
    assert!(
        headers.get("content-length").is_none(),
        "a /proc file's size (0) is not announced: {headers:?}"
    );
    let (status, _, body) = envd
        .http("GET", "/files?path=/proc/cpuinfo", &[], vec![])
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).contains("processor"));
    if std::path::Path::new("/sys/kernel/osrelease").exists() {
        let (status, _, body) = envd
            .http("GET", "/files?path=/sys/kernel/osrelease", &[], vec![])
            .await;
        assert_eq!(status, StatusCode::OK);
        let expected = std::fs::read("/sys/kernel/osrelease").expect("osrelease");
        assert_eq!(
            body, expected,
            "a sysfs file (4096 by its size) downloads whole"
        );
    }

    // A regular file still announces its length, and sends exactly it.
    let data = random_bytes(100_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("regular.bin");
    std::fs::write(&file, &data).expect("write");
    let (status, headers, body) = envd
        .http(
            "GET",
            &format!("/files?path={}", file.display()),
            &[],
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-length"], "100000");
    assert_eq!(body, data);

    for device in ["/dev/zero", "/dev/null"] {
        let (status, _, body) = envd
            .http("GET", &format!("/files?path={device}"), &[], vec![])
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{device}");
        let err = json(&body);
        assert!(
            err["message"]
                .as_str()
                .unwrap_or("")
                .contains("not a regular file"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn filesystem_rpcs_stat_list_make_move_remove() {
    let envd = TestEnvd::start().await;
    for json_codec in [false, true] {
        let fs = envd.fs(json_codec);
        let base = if json_codec {
            "/home/user/j"
        } else {
            "/home/user/p"
        };
        let made = fs
            .make_dir(MakeDirRequest {
                path: format!("{base}/d1/d2"),
                ..Default::default()
            })
            .await
            .expect("make dir")
            .into_owned();
        let entry = made.entry.as_option().expect("entry");
        assert_eq!(entry.path, format!("{base}/d1/d2"));
        assert_eq!(entry.name, "d2");
        assert_eq!(entry.r#type.as_known(), Some(FileType::FILE_TYPE_DIRECTORY));
        let err = fs
            .make_dir(MakeDirRequest {
                path: format!("{base}/d1"),
                ..Default::default()
            })
            .await
            .expect_err("exists");
        assert_eq!(err.code, ErrorCode::AlreadyExists);

        std::fs::write(envd.host(&format!("{base}/d1/f.txt")), b"hello").expect("write");
        let stat = fs
            .stat(StatRequest {
                path: format!("{base}/d1/f.txt"),
                ..Default::default()
            })
            .await
            .expect("stat")
            .into_owned();
        let e = stat.entry.as_option().expect("entry");
        assert_eq!(e.size, 5);
        assert_eq!(e.r#type.as_known(), Some(FileType::FILE_TYPE_FILE));
        assert!(e.permissions.starts_with("-rw"), "{}", e.permissions);
        assert_eq!(e.permissions.len(), 10);
        assert!(!e.owner.is_empty() && !e.group.is_empty());
        assert!(e.modified_time.as_option().is_some_and(|t| t.seconds > 0));

        let listed = fs
            .list_dir(ListDirRequest {
                path: base.to_string(),
                depth: 2,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_owned();
        let paths: Vec<&str> = listed.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                format!("{base}/d1").as_str(),
                format!("{base}/d1/d2").as_str(),
                format!("{base}/d1/f.txt").as_str()
            ]
        );
        let shallow = fs
            .list_dir(ListDirRequest {
                path: base.to_string(),
                depth: 1,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_owned();
        assert_eq!(shallow.entries.len(), 1);

        let moved = fs
            .r#move(MoveRequest {
                source: format!("{base}/d1/f.txt"),
                destination: format!("{base}/new/place.txt"),
                ..Default::default()
            })
            .await
            .expect("move")
            .into_owned();
        assert_eq!(
            moved.entry.as_option().map(|e| e.path.clone()),
            Some(format!("{base}/new/place.txt"))
        );
        let err = fs
            .stat(StatRequest {
                path: format!("{base}/d1/f.txt"),
                ..Default::default()
            })
            .await
            .expect_err("moved away");
        assert_eq!(err.code, ErrorCode::NotFound);

        fs.remove(RemoveRequest {
            path: format!("{base}/d1"),
            ..Default::default()
        })
        .await
        .expect("remove dir");
        assert!(!envd.host(&format!("{base}/d1")).exists());
        // Removing what is already gone is not an error (E2B's envd).
        fs.remove(RemoveRequest {
            path: format!("{base}/d1"),
            ..Default::default()
        })
        .await
        .expect("removing a missing path succeeds");
        assert!(!envd.host(&format!("{base}/d1")).exists());
    }
}

/// As E2B's envd: a symlink is reported as what it points to (type and
/// mode of the target), with `symlink_target`; a dangling one has no type.
#[tokio::test]
async fn symlinks_are_reported_as_their_targets() {
    use std::os::unix::fs::PermissionsExt;
    let envd = TestEnvd::start().await;
    let home = envd.host("/home/user");
    std::fs::write(home.join("target.txt"), b"t").expect("write");
    std::fs::set_permissions(
        home.join("target.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .expect("chmod");
    std::fs::create_dir(home.join("dir")).expect("mkdir");
    std::os::unix::fs::symlink("target.txt", home.join("link")).expect("symlink");
    std::os::unix::fs::symlink("dir", home.join("dirlink")).expect("symlink");
    std::os::unix::fs::symlink("nowhere", home.join("dangling")).expect("symlink");
    let fs = envd.fs(false);
    let stat = |path: &'static str| {
        let fs = fs.clone();
        async move {
            fs.stat(StatRequest {
                path: path.into(),
                ..Default::default()
            })
            .await
            .expect("stat")
            .into_owned()
            .entry
            .into_option()
            .expect("entry")
        }
    };
    let e = stat("link").await;
    assert_eq!(e.r#type.as_known(), Some(FileType::FILE_TYPE_FILE));
    assert_eq!(e.mode, 0o640, "the target's mode");
    assert_eq!(e.symlink_target.as_deref(), Some("/home/user/target.txt"));
    assert!(e.permissions.starts_with('L'), "{}", e.permissions);
    assert_eq!(e.path, "/home/user/link");

    let e = stat("dirlink").await;
    assert_eq!(e.r#type.as_known(), Some(FileType::FILE_TYPE_DIRECTORY));
    assert_eq!(e.symlink_target.as_deref(), Some("/home/user/dir"));

    let e = stat("dangling").await;
    assert_eq!(e.r#type.as_known(), Some(FileType::FILE_TYPE_UNSPECIFIED));
    assert_eq!(e.symlink_target.as_deref(), Some("/home/user/nowhere"));

    // A listing says the same; a plain file has no target.
    let listed = fs
        .list_dir(ListDirRequest {
            path: "/home/user".into(),
            depth: 1,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_owned();
    let by_name = |n: &str| {
        listed
            .entries
            .iter()
            .find(|e| e.name == n)
            .unwrap_or_else(|| panic!("{n} listed"))
            .clone()
    };
    assert_eq!(
        by_name("link").r#type.as_known(),
        Some(FileType::FILE_TYPE_FILE)
    );
    assert_eq!(
        by_name("dirlink").r#type.as_known(),
        Some(FileType::FILE_TYPE_DIRECTORY)
    );
    assert_eq!(by_name("target.txt").symlink_target, None);
}

#[tokio::test]
async fn paths_never_escape_the_root() {
    let envd = TestEnvd::start().await;
    let home = envd.host("/home/user");
    std::os::unix::fs::symlink("/etc", home.join("etc-link")).expect("symlink");
    std::os::unix::fs::symlink("../../..", home.join("up")).expect("symlink");

    // `..` above the sandbox's `/`: a client error.
    let (status, _, res) = envd
        .http("GET", "/files?path=/../../../../etc/passwd", &[], vec![])
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&res)
    );
    // A symlink to the host's /etc: refused.
    let (status, _, _) = envd
        .http("GET", "/files?path=etc-link/passwd", &[], vec![])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = envd.http("GET", "/files?path=up/up/etc", &[], vec![]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Writing through one is refused too, and nothing lands outside.
    let (ct, body) = multipart(&[("etc-link/warren-escape-test", b"x")]);
    let (status, _, _) = envd
        .http("POST", "/files", &[("content-type", &ct)], body)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!std::path::Path::new("/etc/warren-escape-test").exists());
    let (ct, body) = multipart(&[("../../../escape.txt", b"x")]);
    let (status, _, _) = envd
        .http("POST", "/files", &[("content-type", &ct)], body)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let fs = envd.fs(false);
    let err = fs
        .stat(StatRequest {
            path: "etc-link/passwd".into(),
            ..Default::default()
        })
        .await
        .expect_err("symlink escape");
    assert_eq!(err.code, ErrorCode::PermissionDenied);
    let err = fs
        .list_dir(ListDirRequest {
            path: "../../..".into(),
            ..Default::default()
        })
        .await
        .expect_err("dotdot escape");
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    let err = fs
        .list_dir(ListDirRequest {
            path: "up".into(),
            ..Default::default()
        })
        .await
        .expect_err("symlink escape");
    assert_eq!(err.code, ErrorCode::PermissionDenied);
    // The sandbox's `/` is the root, not the host's.
    let listed = fs
        .list_dir(ListDirRequest {
            path: "/".into(),
            ..Default::default()
        })
        .await
        .expect("list root")
        .into_owned();
    let names: Vec<&str> = listed.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, vec!["home"]);
    let err = fs
        .remove(RemoveRequest {
            path: "/".into(),
            ..Default::default()
        })
        .await
        .expect_err("root");
    assert_eq!(err.code, ErrorCode::InvalidArgument);

    // A process cwd is confined the same way.
    let client = envd.process(false);
    let err = stream_error!(client.start(StartRequest {
        process: ProcessConfig {
            cmd: "pwd".into(),
            cwd: Some("etc-link".into()),
            ..Default::default()
        }
        .into(),
        ..Default::default()
    }));
    assert_eq!(err.code, ErrorCode::PermissionDenied);
}

#[tokio::test]
async fn access_token_guards_everything_but_health() {
    let envd = TestEnvd::start_with(|s| s.with_access_token(TOKEN)).await;
    let (status, _, _) = envd.http("GET", "/health", &[], vec![]).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "/health needs no token");

    let (status, _, res) = envd.http("GET", "/files?path=x", &[], vec![]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(json(&res)["code"], 401);
    let (status, _, _) = envd
        .http(
            "GET",
            "/files?path=x",
            &[("x-access-token", "wrong")],
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    std::fs::write(envd.host("/home/user/x"), b"ok").expect("write");
    let (status, _, body) = envd
        .http(
            "GET",
            "/files?path=x",
            &[
                ("x-access-token", TOKEN),
                // What the SDK also sends; tolerated.
                ("authorization", "Basic dXNlcjo="),
            ],
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, b"ok");

    // A presigned URL, as the SDK's `download_url` makes it.
    let sig = signature("x", "read", "", TOKEN);
    let (status, _, body) = envd
        .http(
            "GET",
            &format!("/files?path=x&signature={sig}"),
            &[],
            vec![],
        )
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a valid signature stands in for the token"
    );
    assert_eq!(body, b"ok");
    let sig = signature("x", "write", "", TOKEN);
    let (status, _, _) = envd
        .http(
            "GET",
            &format!("/files?path=x&signature={sig}"),
            &[],
            vec![],
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a write signature does not read"
    );

    // Expiring signatures: E2B envd's answers, the signature judged first
    // (a forger never learns whether the expiry was the problem).
    let past = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 120;
    let expired = signature("x", "read", "", &format!("{TOKEN}:{past}"));
    let future = signature("x", "read", "", &format!("{TOKEN}:{}", past + 3600));
    for (query, want_status, want_message) in [
        (
            format!("signature={expired}&signature_expiration={past}"),
            StatusCode::UNAUTHORIZED,
            Some("signature is already expired"),
        ),
        (
            format!("signature=v1_forged&signature_expiration={past}"),
            StatusCode::UNAUTHORIZED,
            Some("invalid signature"),
        ),
        (
            format!("signature={expired}&signature_expiration=soon"),
            StatusCode::UNAUTHORIZED,
            Some("invalid signature_expiration"),
        ),
        (
            format!("signature={future}&signature_expiration={}", past + 3600),
            StatusCode::OK,
            None,
        ),
    ] {
        let (status, _, body) = envd
            .http("GET", &format!("/files?path=x&{query}"), &[], vec![])
            .await;
        assert_eq!(status, want_status, "{query}");
        if let Some(message) = want_message {
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["message"], message, "{query}");
            assert_eq!(body["code"], 401, "{query}");
        }
    }

    // RPCs: Connect `unauthenticated`, unary and streaming, proto and JSON.
    let anonymous = warren_envd_proto::process::ProcessClient::new(
        connectrpc::client::HttpClient::plaintext(),
        connectrpc::client::ClientConfig::new(envd.base.clone()),
    );
    let err = anonymous
        .list(ListRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(err.code, ErrorCode::Unauthenticated);
    let err = stream_error!(anonymous.start(StartRequest {
        process: ProcessConfig {
            cmd: "true".into(),
            ..Default::default()
        }
        .into(),
        ..Default::default()
    }));
    assert_eq!(err.code, ErrorCode::Unauthenticated);
    let wrong = warren_envd_proto::process::ProcessClient::new(
        connectrpc::client::HttpClient::plaintext(),
        connectrpc::client::ClientConfig::new(envd.base.clone())
            .json()
            .with_default_header("x-access-token", "nope"),
    );
    let err = wrong
        .list(ListRequest::default())
        .await
        .expect_err("wrong token");
    assert_eq!(err.code, ErrorCode::Unauthenticated);
    // With the token everything works.
    envd.process(true)
        .list(ListRequest::default())
        .await
        .expect("list with the token");
}

/// The e2b SDK's `get_signature` (e2b/sandbox/signature.py).
fn signature(path: &str, operation: &str, user: &str, token: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{path}:{operation}:{user}:{token}").as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
    .replace('+', "%2B")
    .replace('/', "%2F")
}

/// Metadata an upload names is checked before anything is written: a 400
/// naming the problem, and no file.
#[tokio::test]
async fn bad_upload_metadata_is_refused_before_writing() {
    let envd = TestEnvd::start().await;
    let long_key = format!("x-metadata-{}", "k".repeat(300));
    let big = "v".repeat(3000);
    for (header, value, says) in [
        ("x-metadata-", "v", "empty"),
        ("x-metadata-k", "tab\there", "printable"),
        (long_key.as_str(), "v", "limit"),
    ] {
        let (status, _, body) = envd
            .http(
                "POST",
                "/files?path=meta.txt",
                &[
                    ("content-type", "application/octet-stream"),
                    (header, value),
                ],
                b"data".to_vec(),
            )
            .await;
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{header}: {body}");
        assert!(body.contains(says), "{header}: {body}");
    }
    let (status, _, body) = envd
        .http(
            "POST",
            "/files?path=meta.txt",
            &[
                ("content-type", "application/octet-stream"),
                ("x-metadata-a", &big),
                ("x-metadata-b", &big),
            ],
            b"data".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("4096"));
    assert!(!envd.host("/home/user/meta.txt").exists());

    // A good one is kept on the file as `user.e2b.*` attributes.
    let (status, _, body) = envd
        .http(
            "POST",
            "/files?path=meta.txt",
            &[
                ("content-type", "application/octet-stream"),
                ("X-Metadata-Author", "mish"),
            ],
            b"data".to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(answer[0]["metadata"]["author"], "mish");
    let names = rustix::fs::listxattr(envd.host("/home/user/meta.txt"), &mut vec![0u8; 1024][..])
        .expect("listxattr");
    assert!(names > 0, "the attribute is on the file");
}

/// Polled watchers: unknown ids are `not_found`; a removed watcher is gone.
#[tokio::test]
async fn polled_watchers_are_found_by_id_until_removed() {
    use warren_envd_proto::filesystem::{
        CreateWatcherRequest, GetWatcherEventsRequest, RemoveWatcherRequest,
    };
    let envd = TestEnvd::start().await;
    let fs = envd.fs(false);
    let err = fs
        .get_watcher_events(GetWatcherEventsRequest {
            watcher_id: "nope".into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown watcher");
    assert_eq!(err.code, ErrorCode::NotFound);
    let id = fs
        .create_watcher(CreateWatcherRequest {
            path: "/home/user".into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .into_owned()
        .watcher_id;
    std::fs::write(envd.host("/home/user/new.txt"), b"x").expect("write");
    let events = fs
        .get_watcher_events(GetWatcherEventsRequest {
            watcher_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("events")
        .into_owned()
        .events;
    assert!(
        events.iter().any(|e| e.name == "new.txt"
            && e.r#type.as_known()
                == Some(warren_envd_proto::filesystem::EventType::EVENT_TYPE_CREATE)),
        "{events:?}"
    );
    fs.remove_watcher(RemoveWatcherRequest {
        watcher_id: id.clone(),
        ..Default::default()
    })
    .await
    .expect("remove");
    let err = fs
        .remove_watcher(RemoveWatcherRequest {
            watcher_id: id,
            ..Default::default()
        })
        .await
        .expect_err("removed already");
    assert_eq!(err.code, ErrorCode::NotFound);

    // A stream over a file is refused up front.
    std::fs::write(envd.host("/home/user/file.txt"), b"x").expect("write");
    let err = stream_error!(fs.watch_dir(WatchDirRequest {
        path: "file.txt".into(),
        ..Default::default()
    }));
    assert_eq!(err.code, ErrorCode::InvalidArgument);
}
