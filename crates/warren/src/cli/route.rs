//! `warren route <sandbox_id>`: how a gateway routes a sandbox right now.
//!
//! Asks the gateway's `GET /_warren/v1/routes/{id}` (API key, team-scoped)
//! for what its route cache holds and what the scheduler says, and prints
//! both and whether they agree. The question changes nothing: the gateway
//! answers the scheduler side without reading or filling its cache.
//! Each gateway has its own cache: point `--api-url` at the one to inspect.

use super::{parse, ApiArgs};
use serde_json::Value;
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(Debug, clap::Parser)]
#[command(
    name = "warren route",
    about = "Show how a gateway routes a sandbox: its cached route against the scheduler's"
)]
struct Cmd {
    #[command(flatten)]
    api: ApiArgs,
    /// The sandbox to explain.
    sandbox_id: String,
    /// Print the gateway's JSON answer instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Vec<OsString>) -> anyhow::Result<ExitCode> {
    let cmd: Cmd = parse(args)?;
    warren_core::id::validate_sandbox_id(&cmd.sandbox_id)
        .map_err(|e| warren_core::config::ConfigError::Invalid(format!("sandbox id: {e}")))?;
    let client = cmd.api.client()?;
    let path = format!("/_warren/v1/routes/{}", cmd.sandbox_id);
    let answer = client.get_json(&path).await?;
    if cmd.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        print!("{}", render(&cmd.sandbox_id, &answer));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(id: &str, a: &Value) -> String {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let secs = |ms: u64| format!("{:.1}s", ms as f64 / 1000.0);
    let mut out = format!("sandbox    {id}\n");
    let cache = &a["cache"];
    if cache.get("enabled").and_then(Value::as_bool) == Some(false) {
        out.push_str("cached     (route cache disabled on this gateway)\n");
    } else {
        match &a["cached"] {
            Value::Null => out.push_str("cached     nothing (the next request looks it up)\n"),
            c => out.push_str(&format!(
                "cached     node {} at {}, generation {} (cached {} ago, expires in {})\n",
                s(c, "node_id"),
                s(c, "endpoint"),
                n(c, "generation"),
                secs(n(c, "age_ms")),
                secs(n(c, "ttl_left_ms")),
            )),
        }
    }
    match &a["scheduler"] {
        Value::Null => out.push_str("scheduler  no such sandbox\n"),
        b => out.push_str(&format!(
            "scheduler  node {} at {}, generation {}, {}\n",
            s(b, "node_id"),
            s(b, "endpoint"),
            n(b, "generation"),
            s(b, "state"),
        )),
    }
    let agree = a["agree"].as_bool().unwrap_or(false);
    out.push_str(if agree {
        "agree      yes\n"
    } else {
        "agree      NO: the cached route is stale (the next request through it refetches)\n"
    });
    if cache.get("enabled").and_then(Value::as_bool) == Some(true) {
        out.push_str(&format!(
            "cache      ttl {}, capacity {}, watch {} (revision {})\n",
            secs(n(cache, "ttl_ms")),
            n(cache, "capacity"),
            s(cache, "watch"),
            n(cache, "revision"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_a_disagreement() {
        let text = render(
            "abc",
            &json!({
                "sandbox_id": "abc",
                "cached": {"node_id": "n1", "endpoint": "h:1", "generation": 1,
                           "age_ms": 1500, "ttl_left_ms": 28500},
                "scheduler": {"node_id": "n2", "endpoint": "h:2", "generation": 2,
                              "state": "running"},
                "agree": false,
                "cache": {"enabled": true, "capacity": 10, "ttl_ms": 30000,
                          "watch": "off", "revision": 0}
            }),
        );
        assert!(text.contains("node n1 at h:1, generation 1 (cached 1.5s ago, expires in 28.5s)"));
        assert!(text.contains("node n2 at h:2, generation 2, running"));
        assert!(text.contains("agree      NO"));
    }
}
