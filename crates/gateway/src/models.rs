//! E2B control-plane JSON, as the installed `e2b` SDK reads and writes it
//! (`e2b/api/client/models/*.py`): requests are parsed field by field so a
//! bad body gets a 400 naming the field; responses are plain serde structs.

use crate::error::ApiError;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Longest sandbox timeout accepted (30 days), in seconds.
pub const MAX_TIMEOUT_SECS: u64 = 30 * 86_400;

/// `NewSandbox` (v1, default timeout 15 s) / `NewSandboxV2` (default 300 s).
#[derive(Debug, Clone)]
pub struct NewSandbox {
    pub template_id: String,
    pub timeout_secs: u64,
    pub metadata: HashMap<String, String>,
    pub env_vars: HashMap<String, String>,
    /// `allow_internet_access` and `network.allowOut`/`denyOut`; None when
    /// the request says nothing (open internet).
    pub network: Option<warren_core::network::NetworkPolicy>,
    /// `autoPause` / `autoResume.enabled` (both default false).
    pub lifecycle: warren_proto::scheduler::v1::Lifecycle,
    /// `autoPauseMemory: false` with `autoPause`: paused filesystem-only at
    /// the end (the node does it; it copies to forks).
    pub auto_pause_filesystem_only: bool,
    /// `network.allowPublicTraffic` (default true): false makes the
    /// sandbox's ports need its traffic access token.
    pub allow_public_traffic: bool,
    /// `network.maskRequestHost`, checked.
    pub mask_request_host: Option<String>,
    /// `volumeMounts`: the team's volumes by name, each at a path (checked:
    /// valid names and paths, none twice, none inside another).
    pub volume_mounts: Vec<VolumeMountJson>,
}

/// E2B's `SandboxVolumeMount`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeMountJson {
    pub name: String,
    pub path: String,
}

/// `volumeMounts` of a create, checked; paths normalized.
fn volume_mounts(obj: &Map<String, Value>) -> Result<Vec<VolumeMountJson>, ApiError> {
    let items = match obj.get("volumeMounts") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(bad(
                "field \"volumeMounts\" must be a list of {\"name\", \"path\"}".into(),
            ))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = |f: &str| match item.get(f) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(bad(format!(
                "field \"volumeMounts\"[{i}]: {f:?} must be a string"
            ))),
        };
        let name = field("name")?;
        warren_core::volume::validate_name(&name)
            .map_err(|e| bad(format!("field \"volumeMounts\"[{i}]: {e}")))?;
        out.push(VolumeMountJson {
            name,
            path: field("path")?,
        });
    }
    let paths = warren_core::volume::mount_paths(out.iter().map(|m| m.path.as_str()))
        .map_err(|e| bad(format!("field \"volumeMounts\": {e}")))?;
    for (m, p) in out.iter_mut().zip(paths) {
        m.path = p;
    }
    Ok(out)
}

/// `SandboxNetworkUpdateConfig` (`PUT /sandboxes/{id}/network`): the
/// whole new egress policy; an omitted field is cleared.
#[derive(Debug, Clone)]
pub struct NetworkUpdate {
    pub policy: warren_core::network::NetworkPolicy,
}

/// `ConnectSandbox` / `ConnectSandboxV2`, `SandboxTimeoutRequest`,
/// `SandboxForkRequest`: the fields warren uses.
#[derive(Debug, Clone, Default)]
pub struct Timeout {
    pub timeout_secs: Option<u64>,
}

/// `SandboxForkRequest`.
#[derive(Debug, Clone)]
pub struct ForkRequest {
    pub timeout_secs: u64,
    pub count: u32,
}

/// Most forks one request may ask for.
const MAX_FORK_COUNT: u32 = 10;

fn bad(message: String) -> ApiError {
    ApiError::bad_request("invalid_body", message)
}

/// Parses a JSON object body; an empty body counts as `{}` when allowed.
pub fn object(bytes: &[u8], empty_ok: bool) -> Result<Map<String, Value>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return if empty_ok {
            Ok(Map::new())
        } else {
            Err(bad("request body is empty; expected a JSON object".into()))
        };
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad("request body must be a JSON object".into())),
        Err(e) => Err(bad(format!("request body is not valid JSON: {e}"))),
    }
}

fn opt_u64(obj: &Map<String, Value>, field: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("field {field:?} must be a non-negative integer"))),
    }
}

fn timeout_field(obj: &Map<String, Value>) -> Result<Option<u64>, ApiError> {
    let t = opt_u64(obj, "timeout")?;
    if let Some(t) = t {
        if t > MAX_TIMEOUT_SECS {
            return Err(bad(format!(
                "field \"timeout\" is {t} seconds; the limit is {MAX_TIMEOUT_SECS}"
            )));
        }
    }
    Ok(t)
}

fn string_map(obj: &Map<String, Value>, field: &str) -> Result<HashMap<String, String>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(HashMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(bad(format!(
                    "field {field:?}: value of {k:?} must be a string"
                ))),
            })
            .collect(),
        Some(_) => Err(bad(format!("field {field:?} must be an object of strings"))),
    }
}

/// A list of strings at `obj[field]`.
fn string_list(obj: &Map<String, Value>, field: &str) -> Result<Vec<String>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(bad(format!("field {field:?} must be a list of strings"))),
            })
            .collect(),
        Some(_) => Err(bad(format!("field {field:?} must be a list of strings"))),
    }
}

/// What warren's egress cannot do is refused by name rather than dropped:
/// per-domain `rules` (header transforms need a TLS-intercepting egress
/// proxy, which warren does not run) and an `egressProxy`. `prefix` names
/// where the fields sit (`"network."` at create).
fn refuse_unsupported_network(n: &Map<String, Value>, prefix: &str) -> Result<(), ApiError> {
    for (field, empty) in [("rules", "{}"), ("egressProxy", "null")] {
        match n.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.is_empty() => {}
            Some(_) => {
                return Err(bad(format!(
                    "field \"{prefix}{field}\" is not supported by warren (send {empty} or leave it out)"
                )))
            }
        }
    }
    Ok(())
}

/// E2B's `allow_internet_access` and `network` (allowOut, denyOut).
fn network_policy(
    obj: &Map<String, Value>,
) -> Result<Option<warren_core::network::NetworkPolicy>, ApiError> {
    let allow_internet = match obj.get("allow_internet_access") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(bad(
                "field \"allow_internet_access\" must be a boolean".into()
            ))
        }
    };
    let (allow_out, deny_out) = match obj.get("network") {
        None | Some(Value::Null) => (Vec::new(), Vec::new()),
        Some(Value::Object(n)) => {
            refuse_unsupported_network(n, "network.")?;
            (string_list(n, "allowOut")?, string_list(n, "denyOut")?)
        }
        Some(_) => return Err(bad("field \"network\" must be an object".into())),
    };
    if allow_internet.is_none() && allow_out.is_empty() && deny_out.is_empty() {
        return Ok(None);
    }
    let policy = warren_core::network::NetworkPolicy {
        allow_internet: allow_internet.unwrap_or(true),
        allow_out,
        deny_out,
    };
    policy.validate().map_err(bad)?;
    Ok(Some(policy))
}

/// A boolean at `obj[field]`; None when absent or null.
fn opt_bool(obj: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(format!("field {field:?} must be a boolean"))),
    }
}

/// E2B's `autoPause`, `autoPauseMemory` and `autoResume: {enabled}`; and
/// whether the auto-pause is filesystem-only.
fn lifecycle(
    obj: &Map<String, Value>,
) -> Result<(warren_proto::scheduler::v1::Lifecycle, bool), ApiError> {
    let auto_pause = opt_bool(obj, "autoPause")?.unwrap_or(false);
    let keep_memory = opt_bool(obj, "autoPauseMemory")?.unwrap_or(true);
    let auto_resume = match obj.get("autoResume") {
        None | Some(Value::Null) => false,
        Some(Value::Object(r)) => match r.get("enabled") {
            Some(Value::Bool(b)) => *b,
            None | Some(Value::Null) => false,
            Some(_) => return Err(bad("field \"autoResume.enabled\" must be a boolean".into())),
        },
        Some(_) => {
            return Err(bad(
                "field \"autoResume\" must be an object {\"enabled\": bool}".into(),
            ))
        }
    };
    if auto_pause && !keep_memory && auto_resume {
        return Err(bad(
            "\"autoResume\" cannot be enabled with \"autoPauseMemory\": false (a \
             filesystem-only pause must be resumed explicitly)"
                .into(),
        ));
    }
    Ok((
        warren_proto::scheduler::v1::Lifecycle {
            auto_pause,
            auto_resume,
        },
        auto_pause && !keep_memory,
    ))
}

/// `network.allowPublicTraffic` and `network.maskRequestHost` at create.
fn port_access(obj: &Map<String, Value>) -> Result<(bool, Option<String>), ApiError> {
    let Some(Value::Object(n)) = obj.get("network") else {
        return Ok((true, None));
    };
    let public = match n.get("allowPublicTraffic") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(bad(
                "field \"network.allowPublicTraffic\" must be a boolean".into(),
            ))
        }
    };
    let mask = match n.get("maskRequestHost") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => {
            warren_core::network::validate_mask(m).map_err(bad)?;
            Some(m.clone())
        }
        Some(_) => {
            return Err(bad(
                "field \"network.maskRequestHost\" must be a string".into()
            ))
        }
    };
    Ok((public, mask))
}

impl NetworkUpdate {
    /// Parses `SandboxNetworkUpdateConfig`, checking every entry as a
    /// create does. What warren cannot do is refused by name rather than
    /// dropped: per-domain `rules` and an `egressProxy`.
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        // Required (E2B's spec): an empty body would open the internet.
        let obj = object(bytes, false)?;
        refuse_unsupported_network(&obj, "")?;
        let allow_internet = match obj.get("allow_internet_access") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(bad(
                    "field \"allow_internet_access\" must be a boolean".into()
                ))
            }
        };
        let policy = warren_core::network::NetworkPolicy {
            allow_internet,
            allow_out: string_list(&obj, "allowOut")?,
            deny_out: string_list(&obj, "denyOut")?,
        };
        policy
            .validate()
            .map_err(|m| bad(m.replace("network.", "")))?;
        Ok(NetworkUpdate { policy })
    }
}

impl NewSandbox {
    /// Parses `NewSandbox`; `default_timeout` differs between v1 and v2.
    pub fn parse(bytes: &[u8], default_timeout: u64) -> Result<Self, ApiError> {
        let obj = object(bytes, false)?;
        let template_id = match obj.get("templateID") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            Some(Value::String(_)) => return Err(bad("field \"templateID\" is empty".into())),
            Some(_) => return Err(bad("field \"templateID\" must be a string".into())),
            None => return Err(bad("missing required field \"templateID\"".into())),
        };
        Ok(NewSandbox {
            template_id,
            timeout_secs: timeout_field(&obj)?.unwrap_or(default_timeout),
            metadata: string_map(&obj, "metadata")?,
            network: network_policy(&obj)?,
            lifecycle: lifecycle(&obj)?.0,
            auto_pause_filesystem_only: lifecycle(&obj)?.1,
            allow_public_traffic: port_access(&obj)?.0,
            mask_request_host: port_access(&obj)?.1,
            volume_mounts: volume_mounts(&obj)?,
            env_vars: {
                let vars = string_map(&obj, "envVars")?;
                warren_core::env::check_vars(&vars)
                    .map_err(|e| bad(format!("field \"envVars\": {e}")))?;
                vars
            },
        })
    }
}

impl Timeout {
    /// Parses a body with an optional (or, if `required`, mandatory) `timeout`.
    pub fn parse(bytes: &[u8], required: bool) -> Result<Self, ApiError> {
        let obj = object(bytes, !required)?;
        let timeout_secs = timeout_field(&obj)?;
        if required && timeout_secs.is_none() {
            return Err(bad("missing required field \"timeout\"".into()));
        }
        Ok(Timeout { timeout_secs })
    }
}

impl ForkRequest {
    /// Parses `SandboxForkRequest` (defaults: timeout 15 s, count 1).
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let obj = object(bytes, true)?;
        let count = opt_u64(&obj, "count")?.unwrap_or(1);
        if count == 0 || count > u64::from(MAX_FORK_COUNT) {
            return Err(bad(format!(
                "field \"count\" must be between 1 and {MAX_FORK_COUNT}"
            )));
        }
        Ok(ForkRequest {
            timeout_secs: timeout_field(&obj)?.unwrap_or(15),
            count: count as u32,
        })
    }
}

/// `Sandbox`: the answer to create, connect and each fork.
#[derive(Debug, Clone, Serialize)]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// Set when the sandbox was created with `allowPublicTraffic: false`.
    #[serde(rename = "trafficAccessToken", skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
    pub domain: String,
}

/// `SandboxNetworkConfig` as `GET /sandboxes/{id}` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct NetworkDetail {
    #[serde(rename = "allowOut")]
    pub allow_out: Vec<String>,
    #[serde(rename = "denyOut")]
    pub deny_out: Vec<String>,
    #[serde(rename = "allowPublicTraffic")]
    pub allow_public_traffic: bool,
    #[serde(rename = "maskRequestHost", skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
}

impl From<warren_core::node_api::NetworkInfo> for NetworkDetail {
    fn from(n: warren_core::node_api::NetworkInfo) -> Self {
        NetworkDetail {
            allow_out: n.policy.allow_out,
            deny_out: n.policy.deny_out,
            allow_public_traffic: n.allow_public_traffic,
            mask_request_host: n.mask_request_host,
        }
    }
}

/// `ListedSandbox` (list) and, with `envdAccessToken`/`domain`, `SandboxDetail` (get).
#[derive(Debug, Clone, Serialize)]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "startedAt")]
    pub started_at: String,
    #[serde(rename = "endAt")]
    pub end_at: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    /// `running` or `paused`, the only values the SDK's `SandboxState` knows.
    pub state: &'static str,
    pub metadata: HashMap<String, String>,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// `get` only: the sandbox's egress now (from its node).
    #[serde(
        rename = "allowInternetAccess",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkDetail>,
    /// `SandboxLifecycle` (get only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    /// The volumes it mounts (get only).
    #[serde(rename = "volumeMounts", skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMountJson>>,
}

/// `SandboxLifecycle`: what happens at the timeout and on traffic while paused.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxLifecycle {
    #[serde(rename = "autoResume")]
    pub auto_resume: bool,
    /// `kill` or `pause`.
    #[serde(rename = "onTimeout")]
    pub on_timeout: &'static str,
}

/// One entry of the fork answer: the child, or why it failed.
#[derive(Debug, Clone, Serialize)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ForkError>,
}

/// The `Error` inside a failed [`ForkResult`].
#[derive(Debug, Clone, Serialize)]
pub struct ForkError {
    pub code: u16,
    pub error_code: &'static str,
    pub message: String,
}

/// The `metadata` list filter: a URL-encoded query string (`k=v&k2=v2`)
/// whose keys and values are themselves percent-encoded, as the SDK sends it.
pub fn parse_metadata_filter(raw: &str) -> HashMap<String, String> {
    form_urlencoded::parse(raw.as_bytes())
        .map(|(k, v)| {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (decode(&k), decode(&v))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn new_sandbox_fields() {
        let s = NewSandbox::parse(
            br#"{"templateID":"base","timeout":60,"metadata":{"a":"b"},"envVars":{"X":"1"},"autoPause":false}"#,
            300,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.template_id, "base");
        assert_eq!(s.timeout_secs, 60);
        assert_eq!(s.metadata["a"], "b");
        assert_eq!(s.env_vars["X"], "1");

        let e = NewSandbox::parse(br#"{"timeout":1}"#, 300).unwrap_err();
        assert!(e.message.contains("templateID"), "{}", e.message);
        let e = NewSandbox::parse(br#"{"templateID":"base","timeout":"x"}"#, 300).unwrap_err();
        assert!(e.message.contains("\"timeout\""), "{}", e.message);
        let e = NewSandbox::parse(br#"{"templateID":"base","metadata":{"a":1}}"#, 300).unwrap_err();
        assert!(e.message.contains("metadata"), "{}", e.message);
        let e = NewSandbox::parse(b"{nope", 300).unwrap_err();
        assert!(e.message.contains("JSON"), "{}", e.message);
        // Lifecycle: defaults off; autoPause + autoResume; bad shapes named.
        assert_eq!(s.lifecycle, Default::default());
        let s = NewSandbox::parse(
            br#"{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}"#,
            300,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(s.lifecycle.auto_pause && s.lifecycle.auto_resume);
        let e = NewSandbox::parse(br#"{"templateID":"base","autoPause":"yes"}"#, 300).unwrap_err();
        assert!(e.message.contains("autoPause"), "{}", e.message);
        let e = NewSandbox::parse(br#"{"templateID":"base","autoResume":true}"#, 300).unwrap_err();
        assert!(e.message.contains("autoResume"), "{}", e.message);
        let s = NewSandbox::parse(
            br#"{"templateID":"base","autoPause":true,"autoPauseMemory":false}"#,
            300,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(s.lifecycle.auto_pause && s.auto_pause_filesystem_only);
        // Without autoPause, autoPauseMemory says nothing.
        let s = NewSandbox::parse(br#"{"templateID":"base","autoPauseMemory":false}"#, 300)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!s.lifecycle.auto_pause && !s.auto_pause_filesystem_only);
        let e = NewSandbox::parse(
            br#"{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}"#,
            300,
        )
        .unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("autoPauseMemory"), "{}", e.message);
        let e = NewSandbox::parse(b"{nope", 300).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
    }

    #[test]
    fn network_update_fields() {
        let u = NetworkUpdate::parse(br#"{"denyOut":["8.8.8.8"]}"#).unwrap();
        assert!(u.policy.allow_internet);
        assert_eq!(u.policy.deny_out, vec!["8.8.8.8".to_string()]);
        // An empty update clears everything: open internet.
        let u = NetworkUpdate::parse(b"{}").unwrap();
        assert_eq!(u.policy, warren_core::network::NetworkPolicy::open());
        assert!(NetworkUpdate::parse(b"").is_err());
        let u = NetworkUpdate::parse(br#"{"allow_internet_access":false}"#).unwrap();
        assert!(!u.policy.has_network());
        for (body, names) in [
            (&br#"{"denyOut":["example.com"]}"#[..], "example.com"),
            (br#"{"allowOut":["1.2.3.4/99"]}"#, "1.2.3.4/99"),
            (br#"{"allowOut":"1.1.1.1"}"#, "allowOut"),
            (
                br#"{"allow_internet_access":"no"}"#,
                "allow_internet_access",
            ),
            (br#"{"egressProxy":{"address":"p:1080"}}"#, "egressProxy"),
            (br#"{"rules":{"a.com":[]}}"#, "rules"),
        ] {
            let e = NetworkUpdate::parse(body).unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
            assert!(e.message.contains(names), "{}", e.message);
        }
    }

    /// Past the entry bound, create and update are a 400 naming the field
    /// and the limit; at it they pass.
    #[test]
    fn network_lists_are_bounded() {
        use warren_core::network::MAX_ENTRIES;
        let list = |n: usize| -> String {
            let v: Vec<String> = (0..n)
                .map(|i| format!("10.{}.{}.1", i / 256, i % 256))
                .collect();
            serde_json::to_string(&v).unwrap()
        };
        let create = |field: &str, n: usize| {
            let body = format!(
                r#"{{"templateID":"base","network":{{"{field}":{}}}}}"#,
                list(n)
            );
            NewSandbox::parse(body.as_bytes(), 300)
        };
        let update = |field: &str, n: usize| {
            NetworkUpdate::parse(format!(r#"{{"{field}":{}}}"#, list(n)).as_bytes())
        };
        for field in ["allowOut", "denyOut"] {
            assert!(create(field, MAX_ENTRIES).is_ok());
            assert!(update(field, MAX_ENTRIES).is_ok());
            for e in [
                create(field, MAX_ENTRIES + 1).unwrap_err(),
                update(field, MAX_ENTRIES + 1).unwrap_err(),
            ] {
                assert_eq!(e.status.as_u16(), 400);
                assert!(
                    e.message.contains(field) && e.message.contains("at most 1000"),
                    "{}",
                    e.message
                );
            }
        }
    }

    #[test]
    fn port_access_at_create() {
        let s = NewSandbox::parse(
            br#"{"templateID":"base","network":{"allowPublicTraffic":false,"maskRequestHost":"h.example.com:${PORT}"}}"#,
            300,
        )
        .unwrap();
        assert!(!s.allow_public_traffic);
        assert_eq!(
            s.mask_request_host.as_deref(),
            Some("h.example.com:${PORT}")
        );
        let s = NewSandbox::parse(br#"{"templateID":"base"}"#, 300).unwrap();
        assert!(s.allow_public_traffic && s.mask_request_host.is_none());
        let e = NewSandbox::parse(
            br#"{"templateID":"base","network":{"maskRequestHost":"a b"}}"#,
            300,
        )
        .unwrap_err();
        assert!(e.message.contains("maskRequestHost"), "{}", e.message);
    }

    #[test]
    fn unsupported_network_fields_are_refused_at_create() {
        // A header transform silently dropped would send a request without
        // the credential it was meant to carry: refused, by name.
        for (body, names) in [
            (
                &br#"{"templateID":"base","network":{"rules":{"a.com":[{"transform":{"headers":{"X":"1"}}}]}}}"#[..],
                "network.rules",
            ),
            (
                br#"{"templateID":"base","network":{"egressProxy":{"address":"p:1080"}}}"#,
                "network.egressProxy",
            ),
        ] {
            let e = NewSandbox::parse(body, 300).unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
            assert!(e.message.contains(names), "{}", e.message);
        }
        NewSandbox::parse(
            br#"{"templateID":"base","network":{"rules":{},"egressProxy":null}}"#,
            300,
        )
        .unwrap();
    }

    #[test]
    fn metadata_filter_is_double_encoded() {
        // The SDK: urlencode({quote(k): quote(v)}) -> "user%2520id=a%2520b&app=prod",
        // which arrives here once decoded by the query-string parser.
        let m = parse_metadata_filter("user%2520id=a%2520b&app=prod");
        assert_eq!(m["user id"], "a b");
        assert_eq!(m["app"], "prod");
    }
}
