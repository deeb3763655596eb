//! E2B's tag queries on a team's template: `GET /templates/{id}/tags`,
//! `/tags/count`, `/tags/exists?tag=`, `/tags/groups` and
//! `/tags/{tag}/assignments`.
//!
//! They answer from the same records `POST`/`DELETE /templates/tags`
//! (`builds::assign_tags`, `builds::remove_tags`) and builds change: one
//! record per tag of a name (`name` for `default`, `name:tag` otherwise),
//! naming the build it holds. warren keeps a tag's current assignment, not
//! its history: each tag has exactly one assignment (its record), made when
//! the build finished or the tag was assigned. Another team's template
//! (public or not) answers `404` here, as for any name the team has no
//! template under.

use super::catalog::Versioned;
use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use warren_core::body::Body;
use warren_core::time::rfc3339_ms;

/// Most tags one groups page carries, and assignments one tag shows.
const MAX_TAGS: usize = 100;

/// One tag of a template: its name, record and the build it holds.
struct Tag {
    tag: String,
    record: Versioned,
    build_id: String,
    assigned_ms: i64,
}

/// The team's tags of template `raw` (name, with or without a tag), by
/// tag name; `404` when the team has no template of that name.
async fn tags_of(app: &App, team: &Team, raw: &str) -> Result<(String, Vec<Tag>), ApiError> {
    let id = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| {
            ApiError::bad_request("invalid_template_id", "the template id is not UTF-8")
        })?;
    let id = id.rsplit('/').next().unwrap_or(&id).to_string();
    let name = id.split(':').next().unwrap_or_default().to_string();
    super::snapshots::validate_name(&name)?;
    super::snapshots::records_ready(app)?;
    let mut tags: Vec<Tag> = super::manage::team_records(app, &team.0, &name)
        .await?
        .into_iter()
        .filter(|(t, _)| super::builds::is_built(t))
        .map(|(t, v)| {
            let called = t
                .snapshot
                .as_ref()
                .and_then(|s| s.name.clone())
                .unwrap_or_default();
            let tag = called
                .split_once(':')
                .map(|(_, tag)| tag.to_string())
                .unwrap_or_else(|| super::builds::DEFAULT_TAG.to_string());
            Tag {
                tag,
                build_id: super::builds::build_of(&t),
                assigned_ms: t.created_at_ms as i64,
                record: (t, v),
            }
        })
        .collect();
    if tags.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "template_not_found",
            format!("template {name:?} not found (see GET /templates)"),
        ));
    }
    tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    Ok((name, tags))
}

/// A v4-shaped UUID from `seed` (stable: the same assignment answers the
/// same id).
fn uuid_of(seed: &str) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(seed.as_bytes());
    let x: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &x[..8],
        &x[8..12],
        &x[13..16],
        &x[17..20],
        &x[20..32]
    )
}

/// E2B's `TemplateTagAssignment` of `t`, with its build's times when the
/// scheduler still keeps the build (`--build-retention`).
async fn assignment(app: &App, team: &Team, t: &Tag) -> serde_json::Value {
    let (created, finished) = match app.builds.get(&t.build_id, &team.0).await {
        Ok(b) => (
            b.requested_at_ms,
            (b.finished_at_ms > 0).then_some(b.finished_at_ms),
        ),
        Err(_) => (t.assigned_ms, Some(t.assigned_ms)),
    };
    serde_json::json!({
        "assignmentId": uuid_of(&format!("{}@{}", t.record.0.name, t.assigned_ms)),
        "buildId": t.build_id,
        "assignedAt": rfc3339_ms(t.assigned_ms),
        "buildCreatedAt": rfc3339_ms(created),
        "buildFinishedAt": finished.map(rfc3339_ms),
    })
}

/// `GET /templates/{id}/tags`: E2B's `TemplateTag`s.
pub(super) async fn list(app: &App, team: &Team, raw: &str) -> Result<Response<Body>, ApiError> {
    let (_, tags) = tags_of(app, team, raw).await?;
    let out: Vec<serde_json::Value> = tags
        .iter()
        .map(|t| {
            serde_json::json!({
                "tag": t.tag,
                "buildID": t.build_id,
                "createdAt": rfc3339_ms(t.assigned_ms),
            })
        })
        .collect();
    reply(StatusCode::OK, &out)
}

/// `GET /templates/{id}/tags/count`: `{"total": n}`.
pub(super) async fn count(app: &App, team: &Team, raw: &str) -> Result<Response<Body>, ApiError> {
    let (_, tags) = tags_of(app, team, raw).await?;
    reply(StatusCode::OK, &serde_json::json!({ "total": tags.len() }))
}

/// `GET /templates/{id}/tags/exists?tag=`: `{"exists", "normalizedTag"}`
/// (the tag trimmed; a tag that cannot be one is a `400`).
pub(super) async fn exists(
    app: &App,
    team: &Team,
    raw: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let tag = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "tag")
        .map(|(_, v)| v.trim().to_string())
        .ok_or_else(|| {
            ApiError::bad_request("invalid_query", "the tag query parameter is required")
        })?;
    super::builds::validate_tag(&tag)?;
    let (_, tags) = tags_of(app, team, raw).await?;
    reply(
        StatusCode::OK,
        &serde_json::json!({
            "exists": tags.iter().any(|t| t.tag == tag),
            "normalizedTag": tag,
        }),
    )
}

fn limit(k: &str, v: &str, max: usize) -> Result<usize, ApiError> {
    v.parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::bad_request("invalid_query", format!("{k} must be between 1 and {max}"))
        })
}

/// `GET /templates/{id}/tags/groups?assignmentLimit=&tagsLimit=&tagsCursor=&search=&sort=`:
/// each tag with its assignments (one: see the module doc), sorted
/// (`latest_desc`, the default, `latest_asc`, `name_asc`, `name_desc`),
/// filtered by a substring of the tag, paged (`nextCursor`).
pub(super) async fn groups(
    app: &App,
    team: &Team,
    raw: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_query", m);
    let (mut assignments, mut page, mut from, mut search, mut sort) = (
        6usize,
        25usize,
        0usize,
        None::<String>,
        "latest_desc".to_string(),
    );
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "assignmentLimit" => assignments = limit("assignmentLimit", &v, MAX_TAGS)?,
            "tagsLimit" => page = limit("tagsLimit", &v, MAX_TAGS)?,
            "tagsCursor" => {
                from = v
                    .parse()
                    .map_err(|_| bad(format!("tagsCursor {v:?} is not one this API gave")))?
            }
            "search" => search = Some(v.into_owned()),
            "sort" => match v.as_ref() {
                "latest_desc" | "latest_asc" | "name_asc" | "name_desc" => sort = v.into_owned(),
                _ => {
                    return Err(bad(format!(
                        "sort {v:?} is not latest_desc, latest_asc, name_asc or name_desc"
                    )))
                }
            },
            _ => {}
        }
    }
    let (_, mut tags) = tags_of(app, team, raw).await?;
    if let Some(s) = &search {
        tags.retain(|t| t.tag.contains(s.as_str()));
    }
    match sort.as_str() {
        "latest_asc" => tags.sort_by(|a, b| (a.assigned_ms, &a.tag).cmp(&(b.assigned_ms, &b.tag))),
        "name_asc" => tags.sort_by(|a, b| a.tag.cmp(&b.tag)),
        "name_desc" => tags.sort_by(|a, b| b.tag.cmp(&a.tag)),
        _ => tags.sort_by(|a, b| (b.assigned_ms, &a.tag).cmp(&(a.assigned_ms, &b.tag))),
    }
    let mut out = Vec::new();
    for t in tags.iter().skip(from).take(page) {
        let shown: Vec<serde_json::Value> = [assignment(app, team, t).await]
            .into_iter()
            .take(assignments)
            .collect();
        out.push(serde_json::json!({
            "tag": t.tag,
            "assignments": shown,
            "hasMore": false,
        }));
    }
    let next = (from + page < tags.len()).then(|| (from + page).to_string());
    reply(
        StatusCode::OK,
        &serde_json::json!({ "tags": out, "nextCursor": next }),
    )
}

/// `GET /templates/{id}/tags/{tag}/assignments?cursor=&limit=`: the tag's
/// assignments, latest first (its one); `404` for a tag it does not have.
pub(super) async fn assignments(
    app: &App,
    team: &Team,
    raw: &str,
    tag: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "limit" {
            limit("limit", &v, MAX_TAGS)?;
        }
    }
    let tag = percent_encoding::percent_decode_str(tag)
        .decode_utf8()
        .map_err(|_| ApiError::bad_request("invalid_tag", "the tag is not UTF-8"))?;
    super::builds::validate_tag(&tag)?;
    let (name, tags) = tags_of(app, team, raw).await?;
    let Some(t) = tags.iter().find(|t| t.tag == tag) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "tag_not_found",
            format!("template {name:?} has no tag {tag:?}"),
        ));
    };
    reply(
        StatusCode::OK,
        &serde_json::json!({
            "data": [assignment(app, team, t).await],
            "nextCursor": null,
        }),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn assignment_ids_are_stable_uuids() {
        let a = super::uuid_of("snap-x@12");
        assert_eq!(a, super::uuid_of("snap-x@12"));
        assert_ne!(a, super::uuid_of("snap-x@13"));
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'4');
    }
}
