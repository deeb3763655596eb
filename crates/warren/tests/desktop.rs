//! Desktop sandboxes (docs/desktop.md) as their users see them: the
//! unmodified `e2b-desktop` Python SDK (`tests/e2b/desktop.py`) and
//! `@e2b/desktop` JavaScript SDK (`tests/js-desktop/desktop.mjs`) against
//! `warren dev`, one case per test, each on its own `warren dev`:
//! screenshots of the real screen, mouse and keyboard calls whose effects
//! a probe window records, `launch`/`open` starting a terminal, an editor
//! and a browser, the stream with and without a password and of one
//! window; and the stream opened in a real browser (Debian's Chromium)
//! through the gateway's TLS listener by the sandbox's host route, kept
//! idle past the gateway's and node's `--idle-timeout`, and refused with a
//! wrong password.
//!
//! They need what the isolated sandbox tests need (root, cgroups,
//! slirp4netns, nftables), the `desktop` template in
//! `/var/lib/warren/templates` or the store `WARREN_TEMPLATE_DIR` names
//! (scripts/test builds it from templates/desktop.toml), `.venv` and
//! `tests/js-desktop/node_modules` (scripts/setup-test-env), and for the
//! browser test `/usr/bin/chromium` (.ci/run installs it).
#![allow(unused_crate_dependencies)]

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::path::Path;
use std::time::Duration;
use warren_test_support::dev::Dev;
use warren_test_support::sdk::{run_case, run_js_case};

/// In E2B's format (`e2b_` + 40 hex), as a user's SDK would send it.
const KEY: &str = "e2b_4d3e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60";
/// The sandbox domain: names under it are `{port}-{id}.warren.localhost`
/// (a wildcard certificate needs two labels under the `*`).
const DOMAIN: &str = "warren.localhost";
/// The gateway's and node's `--idle-timeout` (and body-progress timeout)
/// in the browser test; its stream stays idle for [`IDLE_SECS`].
const TIMEOUT_SECS: u64 = 3;
const IDLE_SECS: u64 = 8;

/// A `warren dev` whose node and gateway get `node_args` and
/// `gateway_args`.
async fn dev_with(gateway_args: &str, node_args: &str) -> Dev {
    // The store warren dev reads: WARREN_TEMPLATE_DIR (its parts inherit it).
    let dir = std::env::var("WARREN_TEMPLATE_DIR")
        .unwrap_or_else(|_| warren_test_support::templates::TEMPLATE_DIR.into());
    let template = format!("{dir}/templates/desktop.json");
    assert!(
        Path::new(&template).exists(),
        "no desktop template ({template}): build it with \
         `warren template build templates/desktop.toml` (scripts/test does)"
    );
    Dev::start_with(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &[
            "--nodes",
            "1",
            "--runtime",
            "isolated",
            "--gateway-args",
            &format!("--domain {DOMAIN} {gateway_args}"),
            "--node-args",
            node_args,
        ],
        &[("WARREN_DEV_API_KEY", KEY)],
        "isolated: needs root, cgroups, slirp4netns, nftables",
    )
    .await
}

async fn dev() -> Dev {
    dev_with("", "").await
}

async fn python(d: &Dev, case: &str) -> serde_json::Value {
    run_case(
        &d.gateway,
        "desktop.py",
        case,
        KEY,
        &[],
        Duration::from_secs(600),
    )
    .await
}

async fn js(d: &Dev, case: &str, env: &[(&str, String)]) -> serde_json::Value {
    run_js_case(
        &d.gateway,
        "js-desktop",
        "desktop.mjs",
        case,
        KEY,
        env,
        Duration::from_secs(600),
    )
    .await
}

async fn stop(mut d: Dev) {
    let code = d.proc.terminate(Duration::from_secs(30)).await.code;
    assert_eq!(code, Some(0), "warren dev stops cleanly");
}

/// Create gives a `desktop` sandbox of E2B's default size; screenshots are
/// PNGs of the real screen; a click on a window the test opened changes
/// the next screenshot; every mouse call (clicks, double click, scroll,
/// drag, press and release) and keyboard call (`write` in chunks, `press`
/// of keys and chords) reaches the window under the pointer as the X
/// events it names; `wait` waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_screenshot_mouse_and_keyboard_reach_the_screen() {
    let d = dev().await;
    let facts = python(&d, "input").await;
    assert_eq!(facts["template"], "desktop", "{facts}");
    stop(d).await;
}

/// `launch` starts a terminal that runs what is typed into it; `open`
/// opens a text file in the editor and a URL in the browser, which fetches
/// and renders it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_launch_and_open_start_a_terminal_an_editor_and_a_browser() {
    let d = dev().await;
    python(&d, "apps").await;
    stop(d).await;
}

/// A desktop of another size and DPI; the stream's URL is the sandbox's
/// host route and serves noVNC through the gateway; a second start is
/// refused; `stop` closes the port; with `require_auth` the VNC server
/// asks for the password `get_auth_key()` gives; with `window_id` the
/// stream's screen is that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stream_with_a_password_and_of_one_window() {
    let d = dev().await;
    let facts = python(&d, "stream").await;
    assert!(
        facts["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("https://6080-") && u.contains(DOMAIN)),
        "{facts}"
    );
    stop(d).await;
}

/// The JavaScript SDK's calls, with the same effects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_calls_reach_the_screen_and_the_stream_starts() {
    let d = dev().await;
    js(&d, "sdk", &[]).await;
    stop(d).await;
}

/// A CA and a `*.{DOMAIN}` certificate it signs, written into `dir`.
fn make_certs(dir: &Path) {
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("a key");
    let leaf = CertificateParams::new(vec![format!("*.{DOMAIN}")])
        .expect("leaf params")
        .signed_by(&key, &issuer)
        .expect("the leaf certificate");
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).expect("write leaf.pem");
    warren_core::private::write(&dir.join("leaf.key"), key.serialize_pem().as_bytes())
        .expect("write leaf.key");
}

/// The stream in Debian's Chromium (headless), opened at `get_url()` over
/// https through the gateway's TLS listener as a user opens it: noVNC
/// connects and Chromium's screenshots show the desktop and then the
/// colours the test paints in the sandbox. With the gateway's and node's
/// idle and body-progress timeouts at 3 s, the stream stays idle 8 s and
/// the next frame still comes over the same WebSocket. A
/// password stream refuses a wrong password (and shows nothing) and shows
/// the desktop with the right one. Writes the screenshot of the desktop to
/// `target/tmp/desktop-stream.png` (docs/desktop.png is one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_shows_the_stream_through_the_gateway() {
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "no /usr/bin/chromium: apt-get install chromium (.ci/run does)"
    );
    let certs = tempfile::tempdir().expect("a temp dir");
    make_certs(certs.path());
    let cert = certs.path().join("leaf.pem").display().to_string();
    let key = certs.path().join("leaf.key").display().to_string();
    let timeouts =
        format!("--idle-timeout {TIMEOUT_SECS}s --body-progress-timeout {TIMEOUT_SECS}s");
    let d = dev_with(
        &format!(
            "--public-tls-listen 127.0.0.1:0 --public-tls-cert {cert} \
             --public-tls-key {key} {timeouts}"
        ),
        &timeouts,
    )
    .await;
    let tls = d.proc.addr("dev gateway-1 https");
    let port = tls.rsplit(':').next().expect("a port").to_string();
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("desktop-stream.png");
    let facts = js(
        &d,
        "browser",
        &[
            ("DESKTOP_TLS_PORT", port),
            ("DESKTOP_TLS_CERT", cert),
            ("DESKTOP_IDLE_SECS", IDLE_SECS.to_string()),
            ("DESKTOP_SCREENSHOT", screenshot.display().to_string()),
        ],
    )
    .await;
    // The stream was silent (no frame either way) for longer than every
    // listener's idle timeout, and then carried the next frame.
    let silence = facts["silenceSecs"].as_f64().unwrap_or_default();
    assert!(silence > TIMEOUT_SECS as f64 + 1.0, "{facts}");
    assert!(
        facts["refusal"]
            .as_str()
            .is_some_and(|r| r.contains("password check failed")),
        "{facts}"
    );
    assert!(
        screenshot.exists(),
        "no screenshot at {}",
        screenshot.display()
    );
    stop(d).await;
}
