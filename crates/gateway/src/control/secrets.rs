//! E2B's secrets API: `POST /secrets`, `GET /secrets` (paged by
//! `limit`/`nextToken`, `X-Next-Token`), and `GET`, `POST` (a new version)
//! and `DELETE /secrets/{id}`, where `{id}` is a secret's id (`sec_...`)
//! or its name (lower-cased; `sec_` is reserved for ids).
//!
//! Secrets are the team's, kept by the scheduler (its `Secrets` service),
//! values sealed under its secrets key. A value is write-only: no answer
//! carries it, no message quotes it, nothing here logs a request body. It
//! is used only by a node's egress proxy, which resolves a sandbox's
//! `${e2b.secrets.NAME}` placeholders per request (docs/security.md,
//! "Secrets and the egress proxy").

use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::models::object;
use crate::state::App;
use http::{HeaderValue, Method, Response, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use warren_core::body::Body;
use warren_core::time::rfc3339_ms;
use warren_proto::scheduler::v1 as pb;

/// E2B's `paginationLimit` bound.
const MAX_PAGE: u32 = 100;

/// E2B's `Secret`: metadata only, never the value.
#[derive(Debug, Serialize)]
struct SecretJson {
    #[serde(rename = "secretID")]
    secret_id: String,
    name: String,
    #[serde(rename = "currentVersion")]
    current_version: u64,
    metadata: BTreeMap<String, String>,
    #[serde(rename = "createdAt")]
    created_at: String,
    #[serde(rename = "updatedAt")]
    updated_at: String,
}

impl From<pb::Secret> for SecretJson {
    fn from(s: pb::Secret) -> Self {
        SecretJson {
            secret_id: s.secret_id,
            name: s.name,
            current_version: s.version,
            metadata: s.metadata.into_iter().collect(),
            created_at: rfc3339_ms(s.created_at_ms),
            updated_at: rfc3339_ms(s.updated_at_ms),
        }
    }
}

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_body", m)
}

/// `/secrets`: list (GET) or create (POST).
pub(super) async fn collection(
    app: &App,
    team: &Team,
    method: &Method,
    query: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    if method == Method::POST {
        create(app, team, body).await
    } else {
        list(app, team, query).await
    }
}

/// `/secrets/{id}`: get (GET), a new version (POST), delete (DELETE).
pub(super) async fn one(
    app: &App,
    team: &Team,
    method: &Method,
    id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let key = secret_key(id)?;
    match *method {
        Method::POST => update(app, team, &key, body).await,
        Method::DELETE => delete(app, team, &key).await,
        _ => get(app, team, &key).await,
    }
}

/// The path's `{secretID}`: an id or a name, checked (a 400 names it),
/// names lower-cased.
fn secret_key(raw: &str) -> Result<String, ApiError> {
    let id = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| ApiError::bad_request("invalid_secret_id", "the secret id is not UTF-8"))?;
    let ok = |s: &str| warren_core::network::rules::is_secret_name(s);
    if ok(&id) {
        Ok(if id.starts_with(warren_core::secrets::ID_PREFIX) {
            id.into_owned()
        } else {
            id.to_ascii_lowercase()
        })
    } else {
        Err(ApiError::bad_request(
            "invalid_secret_id",
            format!("{id:?} is neither a secret id (sec_...) nor a secret name"),
        ))
    }
}

fn value(obj: &Map<String, Value>) -> Result<String, ApiError> {
    let v = match obj.get("value") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => return Err(bad("missing required field \"value\"")),
        Some(_) => return Err(bad("field \"value\" must be a string")),
    };
    warren_core::secrets::value(&v).map_err(bad)?;
    Ok(v)
}

fn metadata(obj: &Map<String, Value>) -> Result<Option<HashMap<String, String>>, ApiError> {
    let m: BTreeMap<String, String> = match obj.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(bad(format!(
                    "field \"metadata\": value of {k:?} must be a string"
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("field \"metadata\" must be an object of strings")),
    };
    warren_core::secrets::metadata(&m).map_err(bad)?;
    Ok(Some(m.into_iter().collect()))
}

/// A scheduler's refusal as the API's answer: NOT_FOUND and a name taken
/// are about the secret, not a sandbox.
fn refused(status: &tonic::Status, what: &str) -> ApiError {
    match status.code() {
        tonic::Code::NotFound => ApiError::new(
            StatusCode::NOT_FOUND,
            "secret_not_found",
            format!("secret {what} not found"),
        ),
        tonic::Code::AlreadyExists => {
            ApiError::new(StatusCode::CONFLICT, "secret_exists", status.message())
        }
        tonic::Code::FailedPrecondition => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "secrets_unavailable",
            status.message(),
        ),
        _ => ApiError::from_scheduler(status, None),
    }
}

async fn create(app: &App, team: &Team, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let obj = object(body, false)?;
    let name = match obj.get("name") {
        Some(Value::String(s)) => warren_core::secrets::name(s).map_err(bad)?,
        None | Some(Value::Null) => return Err(bad("missing required field \"name\"")),
        Some(_) => return Err(bad("field \"name\" must be a string")),
    };
    let value = value(&obj)?;
    let metadata = metadata(&obj)?.unwrap_or_default();
    let max = u32::try_from(app.settings.limits.secrets_team_count).unwrap_or(u32::MAX);
    let s = app
        .scheduler
        .call_secrets("CreateSecret", |mut c| {
            let req = pb::CreateSecretRequest {
                team_id: team.0.clone(),
                name: name.clone(),
                value: value.clone(),
                metadata: metadata.clone(),
                max_per_team: max,
            };
            async move { c.create_secret(req).await }
        })
        .await
        .map_err(|s| refused(&s, &name))?;
    tracing::info!(team = %team.0, secret = %s.secret_id, "secret created");
    reply(StatusCode::CREATED, &SecretJson::from(s))
}

async fn update(
    app: &App,
    team: &Team,
    key: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let obj = object(body, false)?;
    let value = value(&obj)?;
    let metadata = metadata(&obj)?;
    let s = app
        .scheduler
        .call_secrets("UpdateSecret", |mut c| {
            let req = pb::UpdateSecretRequest {
                team_id: team.0.clone(),
                secret: key.to_string(),
                value: value.clone(),
                set_metadata: metadata.is_some(),
                metadata: metadata.clone().unwrap_or_default(),
            };
            async move { c.update_secret(req).await }
        })
        .await
        .map_err(|s| refused(&s, key))?;
    tracing::info!(team = %team.0, secret = %s.secret_id, version = s.version, "secret updated");
    reply(StatusCode::OK, &SecretJson::from(s))
}

async fn get(app: &App, team: &Team, key: &str) -> Result<Response<Body>, ApiError> {
    let s = app
        .scheduler
        .call_secrets("GetSecret", |mut c| {
            let req = pb::GetSecretRequest {
                team_id: team.0.clone(),
                secret: key.to_string(),
            };
            async move { c.get_secret(req).await }
        })
        .await
        .map_err(|s| refused(&s, key))?;
    reply(StatusCode::OK, &SecretJson::from(s))
}

async fn delete(app: &App, team: &Team, key: &str) -> Result<Response<Body>, ApiError> {
    app.scheduler
        .call_secrets("DeleteSecret", |mut c| {
            let req = pb::DeleteSecretRequest {
                team_id: team.0.clone(),
                secret: key.to_string(),
            };
            async move { c.delete_secret(req).await }
        })
        .await
        .map_err(|s| refused(&s, key))?;
    tracing::info!(team = %team.0, secret = %key, "secret deleted");
    Ok(warren_core::body::status(StatusCode::NO_CONTENT))
}

/// `GET /secrets?limit=&nextToken=`: by name; the token is the last name
/// of the page before.
async fn list(app: &App, team: &Team, query: &str) -> Result<Response<Body>, ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_query", m);
    let (mut limit, mut after) = (MAX_PAGE, String::new());
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| bad(format!("limit must be between 1 and {MAX_PAGE}")))?
            }
            "nextToken" => {
                if !warren_core::network::rules::is_secret_name(&v) {
                    return Err(bad(format!("nextToken {v:?} is not one this API gave")));
                }
                after = v.into_owned();
            }
            _ => {}
        }
    }
    let page = app
        .scheduler
        .call_secrets("ListSecrets", |mut c| {
            let req = pb::ListSecretsRequest {
                team_id: team.0.clone(),
                after: after.clone(),
                limit,
            };
            async move { c.list_secrets(req).await }
        })
        .await
        .map_err(|s| refused(&s, ""))?;
    let out: Vec<SecretJson> = page.secrets.into_iter().map(SecretJson::from).collect();
    let mut r = warren_core::body::json(StatusCode::OK, &out);
    if !page.next_after.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&page.next_after) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_are_told_apart_and_checked() {
        assert_eq!(secret_key("sec_abc").unwrap(), "sec_abc");
        assert_eq!(secret_key("OpenAI-Key").unwrap(), "openai-key");
        assert_eq!(secret_key("My%2DKey").unwrap(), "my-key");
        for bad in ["a b", "a%2Fb", "..", "%FF"] {
            assert_eq!(secret_key(bad).unwrap_err().status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn bodies_are_checked_without_quoting_the_value() {
        let obj = object(br#"{"value":"s3cret\r\nX: y"}"#, false).unwrap();
        let e = value(&obj).unwrap_err();
        assert!(!e.message.contains("s3cret"), "{}", e.message);
        let obj = object(br#"{"value":7}"#, false).unwrap();
        assert!(value(&obj).unwrap_err().message.contains("string"));
        let obj = object(br#"{"metadata":{"a":1}}"#, false).unwrap();
        assert!(metadata(&obj).is_err());
    }
}
