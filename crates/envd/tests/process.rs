//! `process.Process` through the generated Connect client: start and stream,
//! reattach with and without an offset, stdin, signals, listing, errors.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

mod common;

use common::{process_gone, Output, TestEnvd};
use connectrpc::ErrorCode;
use std::collections::HashMap;
use warren_envd_proto::process::{
    process_input, process_selector, stream_input_request, CloseStdinRequest, ConnectRequest,
    ListRequest, ProcessConfig, ProcessInput, ProcessSelector, SendInputRequest, SendSignalRequest,
    Signal, StartRequest, StreamInputRequest,
};

fn start_req(cmd: &str, args: &[&str], stdin: bool) -> StartRequest {
    StartRequest {
        process: ProcessConfig {
            cmd: cmd.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
        .into(),
        stdin: Some(stdin),
        ..Default::default()
    }
}

fn pid_selector(pid: u32) -> ProcessSelector {
    ProcessSelector {
        selector: Some(process_selector::Selector::Pid(pid)),
        ..Default::default()
    }
}

fn stdin(data: &[u8]) -> ProcessInput {
    ProcessInput {
        input: Some(process_input::Input::Stdin(data.to_vec())),
        ..Default::default()
    }
}

async fn start_streams_stdout_stderr_and_exit_code(json: bool) {
    let envd = TestEnvd::start().await;
    let client = envd.process(json);
    let mut stream = client
        .start(start_req(
            "sh",
            &["-c", "echo out; echo err >&2; exit 3"],
            false,
        ))
        .await
        .expect("start");
    let out: Output = drain!(stream);
    assert!(
        out.pid.is_some_and(|p| p > 0),
        "a start event with the pid: {out:?}"
    );
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    let end = out.end.expect("an end event");
    assert_eq!(end.exit_code, 3);
    assert!(end.exited);
    assert_eq!(end.status, "exit status 3");
    assert_eq!(end.error, None);
}

#[tokio::test]
async fn start_streams_output_and_exit_code_over_connect_proto() {
    start_streams_stdout_stderr_and_exit_code(false).await;
}

#[tokio::test]
async fn start_streams_output_and_exit_code_over_connect_json() {
    start_streams_stdout_stderr_and_exit_code(true).await;
}

#[tokio::test]
async fn processes_run_in_home_with_default_env_and_request_env() {
    let envd = TestEnvd::start().await;
    let mut req = start_req(
        "sh",
        &["-c", "pwd; echo $HOME; echo $GREETING; echo $PATH"],
        false,
    );
    if let Some(p) = req.process.as_option_mut() {
        p.envs = [("GREETING".to_string(), "hi".to_string())]
            .into_iter()
            .collect();
    }
    let mut stream = envd.process(false).start(req).await.expect("start");
    let out = drain!(stream);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    let home = envd.host("/home/user");
    assert_eq!(lines[0], home.to_string_lossy(), "cwd is the home");
    assert_eq!(lines[1], home.to_string_lossy(), "HOME is the home");
    assert_eq!(lines[2], "hi");
    assert!(lines[3].contains("/usr/bin"), "a sane PATH: {}", lines[3]);
}

/// What `execve` cannot take is the client's mistake, named: one variable
/// over the kernel's limit for one string (`MAX_ARG_STRLEN`), a NUL, and
/// variables too large only together (`E2BIG`). One just at the limit runs.
#[tokio::test]
async fn env_vars_and_arguments_the_kernel_refuses_are_invalid_arguments() {
    let envd = TestEnvd::start().await;
    let client = envd.process(false);
    let limit = warren_core::env::MAX_VAR_BYTES;
    let with_envs = |args: &[&str], envs: Vec<(String, String)>| {
        let mut req = start_req("sh", args, false);
        if let Some(p) = req.process.as_option_mut() {
            p.envs = envs.into_iter().collect();
        }
        req
    };
    // NAME=value of exactly the limit: BIG= is 4 bytes.
    let at_limit = vec![("BIG".to_string(), "x".repeat(limit - 4))];
    let mut stream = client
        .start(with_envs(&["-c", "echo ${#BIG}"], at_limit))
        .await
        .expect("start at the limit");
    let out = drain!(stream);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (limit - 4).to_string()
    );

    // A value of 131072 bytes (what the probe sent).
    let over = vec![("BIG".to_string(), "x".repeat(128 * 1024))];
    let err = stream_error!(client.start(with_envs(&["-c", "true"], over)));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");
    let message = err.message.unwrap_or_default();
    assert!(
        message.contains("\"BIG\"") && message.contains(&limit.to_string()),
        "the message names the variable and the limit: {message}"
    );

    // Each fits, all together do not (over the kernel's ceiling of 6 MiB
    // even with an unlimited stack), within one Connect message.
    let many = (0..56)
        .map(|i| (format!("V{i}"), "y".repeat(125_000)))
        .collect();
    let err = stream_error!(client.start(with_envs(&["-c", "true"], many)));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");
    let message = err.message.unwrap_or_default();
    assert!(message.contains("too large together"), "{message}");

    let nul = vec![("A".to_string(), "x\0y".to_string())];
    let err = stream_error!(client.start(with_envs(&["-c", "true"], nul)));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");
    let err = stream_error!(client.start(start_req("echo", &["a\0b"], false)));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");
    assert!(err.message.unwrap_or_default().contains("args[0]"));

    // envd is unharmed.
    let mut stream = client
        .start(start_req("echo", &["still here"], false))
        .await
        .expect("start");
    assert_eq!(drain!(stream).stdout, b"still here\n");
}

/// The heart of durable output: a client drops mid-stream, the process goes
/// on, and Connect with the byte offset the client had reached replays
/// exactly what it missed, then the rest live, then the end.
async fn dropped_client_resumes_at_offset(json: bool) {
    let envd = TestEnvd::start().await;
    let client = envd.process(json);
    // Prints 20 lines, waits for a line on stdin, prints 20 more (to stdout
    // and stderr alternately), so the test controls when output happens.
    let script = "for i in $(seq 1 20); do echo line $i; sleep 0.01; done; read go; \
                  for i in $(seq 21 40); do if [ $((i % 2)) = 0 ]; then echo line $i; else echo line $i >&2; fi; sleep 0.01; done";
    let mut req = start_req("bash", &["-c", script], true);
    req.tag = Some("counter".to_string());
    let mut stream = client.start(req).await.expect("start");
    let mut first = Output::default();
    read_until!(stream, first, |o: &Output| o.data_events >= 2);
    let pid = first.pid.expect("pid");
    let seen = first.all.clone();
    drop(stream);

    // It is still running (blocked on stdin) and listed with its tag.
    let listed = client
        .list(ListRequest::default())
        .await
        .expect("list")
        .into_owned();
    let info = listed
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .expect("the dropped process is still listed");
    assert_eq!(info.tag.as_deref(), Some("counter"));
    assert_eq!(
        info.config.as_option().map(|c| c.cmd.as_str()),
        Some("bash")
    );

    client
        .send_input(SendInputRequest {
            process: pid_selector(pid).into(),
            input: stdin(b"go\n").into(),
            ..Default::default()
        })
        .await
        .expect("send input");

    let mut resumed = client
        .connect(ConnectRequest {
            process: pid_selector(pid).into(),
            offset: Some(seen.len() as u64),
            ..Default::default()
        })
        .await
        .expect("connect with offset");
    let rest = drain!(resumed);
    assert_eq!(rest.pid, Some(pid));
    let end = rest.end.expect("end event after the replay");
    assert_eq!(end.exit_code, 0);

    let mut assembled = seen.clone();
    assembled.extend_from_slice(&rest.all);
    let expected: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(
        String::from_utf8_lossy(&assembled),
        expected,
        "byte-exact resume"
    );
    // Stderr lines keep their label in the replay.
    assert!(String::from_utf8_lossy(&rest.stderr).contains("line 21\n"));

    // After the end, offset 0 replays the whole retained output again.
    let mut again = client
        .connect(ConnectRequest {
            process: pid_selector(pid).into(),
            offset: Some(0),
            ..Default::default()
        })
        .await
        .expect("connect after exit");
    let all = drain!(again);
    assert_eq!(String::from_utf8_lossy(&all.all), expected);
    assert_eq!(all.end.map(|e| e.exit_code), Some(0));
}

#[tokio::test]
async fn dropped_client_resumes_byte_exactly_with_offset_over_proto() {
    dropped_client_resumes_at_offset(false).await;
}

#[tokio::test]
async fn dropped_client_resumes_byte_exactly_with_offset_over_json() {
    dropped_client_resumes_at_offset(true).await;
}

#[tokio::test]
async fn connect_without_offset_streams_live_output_only() {
    let envd = TestEnvd::start().await;
    let client = envd.process(false);
    let mut stream = client
        .start(start_req(
            "sh",
            &["-c", "echo before; read x; echo after"],
            true,
        ))
        .await
        .expect("start");
    let mut first = Output::default();
    read_until!(stream, first, |o: &Output| o.stdout == b"before\n");
    let pid = first.pid.expect("pid");

    let mut tagless = client
        .connect(ConnectRequest {
            process: pid_selector(pid).into(),
            ..Default::default()
        })
        .await
        .expect("connect");
    let mut live = Output::default();
    read_until!(tagless, live, |o: &Output| o.pid.is_some());
    client
        .send_input(SendInputRequest {
            process: pid_selector(pid).into(),
            input: stdin(b"\n").into(),
            ..Default::default()
        })
        .await
        .expect("send input");
    let rest = drain!(tagless);
    live.stdout.extend(rest.stdout);
    assert_eq!(
        live.stdout, b"after\n",
        "no replay of earlier output without an offset"
    );
    assert_eq!(rest.end.map(|e| e.exit_code), Some(0));
}

#[tokio::test]
async fn connect_by_tag_and_unknown_pid_or_tag() {
    let envd = TestEnvd::start().await;
    let client = envd.process(false);
    let mut req = start_req("sh", &["-c", "read x; echo tagged"], true);
    req.tag = Some("my-tag".to_string());
    let mut stream = client.start(req).await.expect("start");
    let mut first = Output::default();
    read_until!(stream, first, |o: &Output| o.pid.is_some());
    let by_tag = ProcessSelector {
        selector: Some(process_selector::Selector::Tag("my-tag".to_string())),
        ..Default::default()
    };
    client
        .send_input(SendInputRequest {
            process: by_tag.clone().into(),
            input: stdin(b"\n").into(),
            ..Default::default()
        })
        .await
        .expect("send input by tag");
    let mut replay = client
        .connect(ConnectRequest {
            process: by_tag.into(),
            offset: Some(0),
            ..Default::default()
        })
        .await
        .expect("connect by tag");
    let out = drain!(replay);
    assert_eq!(out.pid, first.pid);
    assert_eq!(out.stdout, b"tagged\n");

    let err = stream_error!(client.connect(ConnectRequest {
        process: pid_selector(999_999).into(),
        ..Default::default()
    }));
    assert_eq!(err.code, ErrorCode::NotFound, "{err:?}");
    let err = client
        .send_signal(SendSignalRequest {
            process: ProcessSelector {
                selector: Some(process_selector::Selector::Tag("nope".into())),
                ..Default::default()
            }
            .into(),
            signal: Signal::SIGNAL_SIGKILL.into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown tag");
    assert_eq!(err.code, ErrorCode::NotFound);
}

#[tokio::test]
async fn sigkill_ends_the_process_and_its_children() {
    let envd = TestEnvd::start().await;
    let client = envd.process(false);
    let mut stream = client
        .start(start_req(
            "bash",
            &["-c", "sleep 300 & echo $!; wait"],
            false,
        ))
        .await
        .expect("start");
    let mut out = Output::default();
    read_until!(stream, out, |o: &Output| o.stdout.ends_with(b"\n"));
    let pid = out.pid.expect("pid");
    let child: i32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("child pid");

    client
        .send_signal(SendSignalRequest {
            process: pid_selector(pid).into(),
            signal: Signal::SIGNAL_SIGKILL.into(),
            ..Default::default()
        })
        .await
        .expect("signal");
    let rest = drain!(stream);
    let end = rest.end.expect("end event");
    assert!(!end.exited);
    assert_eq!(end.exit_code, -1);
    assert_eq!(end.status, "signal: killed");
    common::eventually("the background child to die with its group", || {
        process_gone(child)
    })
    .await;

    let listed = client
        .list(ListRequest::default())
        .await
        .expect("list")
        .into_owned();
    assert!(
        listed.processes.iter().all(|p| p.pid != pid),
        "killed processes are not listed"
    );
}

#[tokio::test]
async fn send_input_and_close_stdin_drive_cat() {
    let envd = TestEnvd::start().await;
    let client = envd.process(true);
    let mut stream = client
        .start(start_req("cat", &[], true))
        .await
        .expect("start");
    let mut out = Output::default();
    read_until!(stream, out, |o: &Output| o.pid.is_some());
    let pid = out.pid.expect("pid");
    let binary: Vec<u8> = (0u8..=255).collect();
    client
        .send_input(SendInputRequest {
            process: pid_selector(pid).into(),
            input: stdin(&binary).into(),
            ..Default::default()
        })
        .await
        .expect("send input");
    read_until!(stream, out, |o: &Output| o.stdout.len() >= 256);
    assert_eq!(
        out.stdout, binary,
        "stdin bytes come back unchanged through JSON"
    );
    client
        .close_stdin(CloseStdinRequest {
            process: pid_selector(pid).into(),
            ..Default::default()
        })
        .await
        .expect("close stdin");
    let rest = drain!(stream);
    assert_eq!(rest.end.map(|e| e.exit_code), Some(0), "cat exits on EOF");
}

#[tokio::test]
async fn stream_input_feeds_stdin_in_order() {
    let envd = TestEnvd::start().await;
    let client = envd.process(false);
    let mut stream = client
        .start(start_req("cat", &[], true))
        .await
        .expect("start");
    let mut out = Output::default();
    read_until!(stream, out, |o: &Output| o.pid.is_some());
    let pid = out.pid.expect("pid");
    let mut msgs = vec![StreamInputRequest {
        event: Some(stream_input_request::Event::Start(Box::new(
            stream_input_request::StartEvent {
                process: pid_selector(pid).into(),
                ..Default::default()
            },
        ))),
        ..Default::default()
    }];
    for word in ["one ", "two ", "three\n"] {
        msgs.push(StreamInputRequest {
            event: Some(stream_input_request::Event::Data(Box::new(
                stream_input_request::DataEvent {
                    input: stdin(word.as_bytes()).into(),
                    ..Default::default()
                },
            ))),
            ..Default::default()
        });
    }
    client
        .stream_input(connectrpc::stream_iter(msgs))
        .await
        .expect("stream input");
    read_until!(stream, out, |o: &Output| o.stdout.ends_with(b"\n"));
    assert_eq!(out.stdout, b"one two three\n");
    client
        .close_stdin(CloseStdinRequest {
            process: pid_selector(pid).into(),
            ..Default::default()
        })
        .await
        .expect("close stdin");
    assert!(drain!(stream).end.is_some());
}

#[tokio::test]
async fn input_without_stdin_and_pty_requests_are_refused_clearly() {
    let envd = TestEnvd::start().await;
    let client = envd.process(false);
    let mut stream = client
        .start(start_req("sh", &["-c", "sleep 5"], false))
        .await
        .expect("start");
    let mut out = Output::default();
    read_until!(stream, out, |o: &Output| o.pid.is_some());
    let pid = out.pid.expect("pid");
    let err = client
        .send_input(SendInputRequest {
            process: pid_selector(pid).into(),
            input: stdin(b"x").into(),
            ..Default::default()
        })
        .await
        .expect_err("stdin was not requested");
    assert_eq!(err.code, ErrorCode::FailedPrecondition, "{err:?}");
    client
        .send_signal(SendSignalRequest {
            process: pid_selector(pid).into(),
            signal: Signal::SIGNAL_SIGTERM.into(),
            ..Default::default()
        })
        .await
        .expect("sigterm");
    let end = drain!(stream).end.expect("end");
    assert_eq!(end.status, "signal: terminated");

    // A PTY needs its size, and a size the kernel can hold.
    let mut req = start_req("sh", &[], false);
    req.pty = warren_envd_proto::process::PTY::default().into();
    let err = stream_error!(client.start(req));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");
    assert!(
        err.message.as_deref().unwrap_or("").contains("pty.size"),
        "{err:?}"
    );
    let mut req = start_req("sh", &[], false);
    req.pty = warren_envd_proto::process::PTY {
        size: warren_envd_proto::process::pty::Size {
            cols: 0,
            rows: 24,
            ..Default::default()
        }
        .into(),
        ..Default::default()
    }
    .into();
    let err = stream_error!(client.start(req));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");
    assert!(
        err.message.as_deref().unwrap_or("").contains("cols"),
        "{err:?}"
    );

    let err = stream_error!(client.start(start_req("/no/such/program", &[], false)));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");

    let mut req = start_req("pwd", &[], false);
    if let Some(p) = req.process.as_option_mut() {
        p.cwd = Some("/no/such/dir".into());
    }
    let err = stream_error!(client.start(req));
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err:?}");
    assert!(err
        .message
        .unwrap_or_default()
        .contains("working directory"));
}

#[tokio::test]
async fn offsets_older_than_retained_output_are_out_of_range() {
    let envd = TestEnvd::start_with(|s| s.with_max_output_bytes(1024)).await;
    let client = envd.process(false);
    let mut stream = client
        .start(start_req("sh", &["-c", "head -c 5000 /dev/zero"], false))
        .await
        .expect("start");
    let out = drain!(stream);
    assert_eq!(out.all.len(), 5000, "the live stream got everything");
    let pid = out.pid.expect("pid");
    let err = stream_error!(client.connect(ConnectRequest {
        process: pid_selector(pid).into(),
        offset: Some(0),
        ..Default::default()
    }));
    assert_eq!(err.code, ErrorCode::OutOfRange);
    assert!(
        err.message.as_deref().unwrap_or("").contains("3976"),
        "names the oldest retained offset: {err:?}"
    );
    // The oldest retained offset itself works, and replays exactly 1024 bytes.
    let mut tail = client
        .connect(ConnectRequest {
            process: pid_selector(pid).into(),
            offset: Some(3976),
            ..Default::default()
        })
        .await
        .expect("connect at the oldest offset");
    assert_eq!(drain!(tail).all.len(), 1024);
}

#[tokio::test]
async fn list_shows_running_processes_with_their_config() {
    let envd = TestEnvd::start().await;
    let client = envd.process(true);
    let mut req = start_req("sleep", &["30"], false);
    req.tag = Some("sleeper".into());
    if let Some(p) = req.process.as_option_mut() {
        p.envs = HashMap::from([("A".to_string(), "1".to_string())])
            .into_iter()
            .collect();
    }
    let mut stream = client.start(req).await.expect("start");
    let mut out = Output::default();
    read_until!(stream, out, |o: &Output| o.pid.is_some());
    let listed = client
        .list(ListRequest::default())
        .await
        .expect("list")
        .into_owned();
    let info = listed
        .processes
        .iter()
        .find(|p| Some(p.pid) == out.pid)
        .expect("listed");
    let config = info.config.as_option().expect("config");
    assert_eq!(config.cmd, "sleep");
    assert_eq!(config.args, vec!["30".to_string()]);
    assert_eq!(config.envs.get("A").map(String::as_str), Some("1"));
    assert_eq!(info.tag.as_deref(), Some("sleeper"));
    envd.stop().await;
    let rest = drain!(stream);
    assert_eq!(
        rest.end.map(|e| e.status),
        Some("signal: killed".to_string()),
        "a stream open at shutdown ends with its process's end"
    );
    common::eventually("envd to kill what it started", || {
        process_gone(out.pid.unwrap_or(0) as i32)
    })
    .await;
}

#[tokio::test]
async fn oversized_and_malformed_messages_are_refused() {
    let envd = TestEnvd::start().await;
    let client = envd.process(false);
    let mut stream = client
        .start(start_req("cat", &[], true))
        .await
        .expect("start");
    let mut out = Output::default();
    read_until!(stream, out, |o: &Output| o.pid.is_some());
    let pid = out.pid.expect("pid");
    let err = client
        .send_input(SendInputRequest {
            process: pid_selector(pid).into(),
            input: stdin(&vec![b'x'; 9 * 1024 * 1024]).into(),
            ..Default::default()
        })
        .await
        .expect_err("9 MiB message");
    assert_eq!(err.code, ErrorCode::ResourceExhausted, "{err:?}");
    let message = err.message.unwrap_or_default();
    assert!(
        message.contains("8388608 bytes"),
        "names the limit: {message}"
    );

    let (status, _, body) = envd
        .http(
            "POST",
            "/process.Process/List",
            &[("content-type", "application/proto")],
            vec![0xff, 0xff, 0xff, 0xff, 0x0f],
        )
        .await;
    assert_eq!(
        status,
        http::StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let err: serde_json::Value = serde_json::from_slice(&body).expect("connect error json");
    assert_eq!(err["code"], "invalid_argument");

    let (status, _, body) = envd
        .http(
            "POST",
            "/process.Process/NoSuchMethod",
            &[("content-type", "application/json")],
            b"{}".to_vec(),
        )
        .await;
    assert!(
        status == http::StatusCode::NOT_FOUND || status == http::StatusCode::NOT_IMPLEMENTED,
        "{status} {}",
        String::from_utf8_lossy(&body)
    );
}

/// The node writes a request through to envd over HTTP/1.1 while it is
/// still arriving. envd's early answer to one over the size limit must
/// reach the writer, with a `Content-Length` (refused before a byte is
/// read) and chunked (refused by Connect part-way): it used to close the
/// connection under the writer, whose failed write the node answered with
/// a 502.
#[tokio::test]
async fn an_oversized_unary_request_gets_its_answer_not_a_reset() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::Frame;
    use hyper_util::rt::TokioIo;

    let envd = TestEnvd::start().await;
    let addr = envd.base.authority().expect("authority").to_string();
    for chunked in [false, true] {
        let stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mib = Bytes::from(vec![b'x'; 1 << 20]);
        let body = if chunked {
            // Well past the limit, so that most of it is still unread when
            // Connect gives up on it.
            let frames =
                (0..32).map(move |_| Ok::<_, std::convert::Infallible>(Frame::data(mib.clone())));
            StreamBody::new(futures_util::stream::iter(frames)).boxed()
        } else {
            Full::new(Bytes::from(vec![b'x'; 9 << 20])).boxed()
        };
        let req = http::Request::post("/process.Process/SendInput")
            .header("host", "localhost")
            .header("content-type", "application/proto")
            .header("connect-protocol-version", "1")
            .body(body)
            .expect("request");
        let res = sender
            .send_request(req)
            .await
            .unwrap_or_else(|e| panic!("chunked={chunked}: no answer, the connection failed: {e}"));
        assert_eq!(
            res.status(),
            http::StatusCode::TOO_MANY_REQUESTS,
            "Connect's resource_exhausted"
        );
        let body = res.into_body().collect().await.expect("body").to_bytes();
        let err: serde_json::Value = serde_json::from_slice(&body).expect("connect error json");
        assert_eq!(err["code"], "resource_exhausted", "{err}");
        let message = err["message"].as_str().unwrap_or("");
        // 8388608 (the message limit) or 8389632 (the body limit).
        assert!(
            message.contains("limit") && message.contains("838"),
            "chunked={chunked}: the message names the limit: {message}"
        );
    }
}

#[tokio::test]
async fn quiet_streams_get_keepalives_at_the_requested_interval() {
    let envd = TestEnvd::start().await;
    let client = envd.process(true);
    let mut stream = client
        .start_with_options(
            start_req("sh", &["-c", "sleep 2.5; echo done"], false),
            connectrpc::client::CallOptions::default().with_header("keepalive-ping-interval", "1"),
        )
        .await
        .expect("start");
    let out = drain!(stream);
    assert!(
        out.keepalives >= 1,
        "a silent 2.5 s process gets keepalives: {out:?}"
    );
    assert_eq!(out.stdout, b"done\n");
}

#[tokio::test]
async fn rpcs_work_over_h2c_as_well_as_http1() {
    let envd = TestEnvd::start().await;
    let client = warren_envd_proto::process::ProcessClient::new(
        connectrpc::client::HttpClient::plaintext_http2_only(),
        envd.config(true),
    );
    let mut stream = client
        .start(start_req("sh", &["-c", "echo over h2c"], false))
        .await
        .expect("start over h2c");
    let out = drain!(stream);
    assert_eq!(out.stdout, b"over h2c\n");
    assert_eq!(out.end.map(|e| e.exit_code), Some(0));
}

/// Splits a Connect streaming body into its envelopes: `(flags, payload)`.
fn envelopes(mut body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        out.push((body[0], body[5..5 + len].to_vec()));
        body = &body[5 + len..];
    }
    out
}

/// A client's `Connect-Timeout-Ms` bounds a server stream: a `Start` whose
/// process outlives it ends with `deadline_exceeded` (what the SDK reports
/// as its `timeout`), and the process keeps running, reattachable.
#[tokio::test]
async fn connect_timeout_ms_ends_a_start_stream() {
    let envd = TestEnvd::start().await;
    let request = serde_json::json!({
        "process": {"cmd": "sh", "args": ["-c", "echo started; sleep 30"]},
        "stdin": false,
    })
    .to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&(request.len() as u32).to_be_bytes());
    body.extend_from_slice(request.as_bytes());
    let (status, _, res) = envd
        .http(
            "POST",
            "/process.Process/Start",
            &[
                ("content-type", "application/connect+json"),
                ("connect-timeout-ms", "1500"),
            ],
            body,
        )
        .await;
    assert_eq!(status, http::StatusCode::OK);
    let frames = envelopes(&res);
    let (flags, end) = frames.last().expect("an end-of-stream message");
    assert_eq!(*flags & 0x02, 0x02, "the last envelope ends the stream");
    let end: serde_json::Value = serde_json::from_slice(end).expect("end JSON");
    assert_eq!(end["error"]["code"], "deadline_exceeded", "{end}");
    let pid = frames
        .iter()
        .filter(|(f, _)| f & 0x02 == 0)
        .find_map(|(_, m)| {
            let v: serde_json::Value = serde_json::from_slice(m).ok()?;
            v["event"]["start"]["pid"].as_u64()
        })
        .expect("a start event with the pid");
    assert!(
        frames
            .iter()
            .any(|(_, m)| { String::from_utf8_lossy(m).contains(&base64_of(b"started\n")) }),
        "output before the deadline was delivered"
    );

    // The process outlived the stream and can be reattached.
    let client = envd.process(false);
    let listed = client
        .list(ListRequest::default())
        .await
        .expect("list")
        .into_owned();
    assert!(listed.processes.iter().any(|p| p.pid as u64 == pid));
    client
        .send_signal(SendSignalRequest {
            process: pid_selector(pid as u32).into(),
            signal: Signal::SIGNAL_SIGKILL.into(),
            ..Default::default()
        })
        .await
        .expect("kill");
}

fn base64_of(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}
