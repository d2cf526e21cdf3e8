//! A conversation's project versions, for whoever may read the conversation: which turns
//! published one, the files of a version (each with a reference to download it through
//! `/v1/files` or a signed link), and what changed between two versions.
//!
//! Only versions the record names are shown: a turn's version is the commit its signed
//! `turn_complete` carries, never whatever a ref in the store says.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use turnpike_artifactory::git::Lineage;
use turnpike_artifactory::DirectoryEntry;
use turnpike_schemas::{EntryBody, Family, ProjectVersion, RefPath, Reference, TurnId};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Caller, Params};
use crate::state::Edge;

/// A turn that published a project version.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionView {
    pub turn: String,
    /// The git commit id.
    pub version: String,
    /// When the turn completed (ms since the epoch).
    pub at_ms: u64,
}

/// The versions of a conversation's project, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionList {
    pub versions: Vec<VersionView>,
}

/// One file of a version.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionFileView {
    pub path: String,
    pub size: u64,
    /// `conv:gi:<conversation>/<turn>/<path>`: download it with `GET /v1/files?reference=…`
    /// or a link from `POST /v1/files/links` (absent for a path a reference cannot name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// The files of one version, sorted by path.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionFiles {
    pub turn: String,
    pub version: String,
    pub files: Vec<VersionFileView>,
}

/// One changed file.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileChangeView {
    pub path: String,
    /// `added`, `removed` or `modified`.
    pub change: String,
    /// A unified diff (absent for binary files, files over 1 MiB, and files past the first
    /// 8 MiB of content a diff reads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    pub binary: bool,
}

/// What changed from one version to another.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionDiff {
    /// The earlier turn (absent: compared with an empty project).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub to: String,
    pub changes: Vec<FileChangeView>,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// The earlier turn (default: the version before `turn`'s).
    #[param(pattern = "^turn_[1-9][0-9]{0,17}$")]
    pub from: Option<String>,
}

/// The project versions the conversation's turns published, oldest first.
#[utoipa::path(get, path = "/v1/conversations/{id}/versions", tag = "versions",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = VersionList), (status = 404, body = ErrorBody)))]
pub async fn list_versions(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<VersionList>> {
    let entry = edge.visible(&caller, &id).await?;
    let versions = published(&edge, &entry).await?;
    Ok(Json(VersionList {
        versions: versions
            .into_iter()
            .map(|(turn, (version, at_ms))| VersionView {
                turn: turn.to_string(),
                version: version.to_string(),
                at_ms,
            })
            .collect(),
    }))
}

/// The files of the version `turn` published.
#[utoipa::path(get, path = "/v1/conversations/{id}/versions/{turn}", tag = "versions",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("turn" = String, Path, description = "turn_<n>")),
    responses((status = 200, body = VersionFiles), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub async fn version_files(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((id, turn)): Path<(String, String)>,
) -> ApiResult<Json<VersionFiles>> {
    let entry = edge.visible(&caller, &id).await?;
    let turn = turn_id(&turn)?;
    let versions = published(&edge, &entry).await?;
    let version = version_of(&versions, turn)?;
    let files = lineage(&edge, &entry).files(version).await?;
    Ok(Json(VersionFiles {
        turn: turn.to_string(),
        version: version.to_string(),
        files: files
            .into_iter()
            .map(|f| VersionFileView {
                reference: reference(&entry, turn, &f.path),
                path: f.path,
                size: f.size,
            })
            .collect(),
    }))
}

/// What changed from the version of `from` (default: the version before) to `turn`'s.
#[utoipa::path(get, path = "/v1/conversations/{id}/versions/{turn}/diff", tag = "versions",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("turn" = String, Path, description = "turn_<n>"), DiffQuery),
    responses((status = 200, body = VersionDiff), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub async fn version_diff(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((id, turn)): Path<(String, String)>,
    Params(query): Params<DiffQuery>,
) -> ApiResult<Json<VersionDiff>> {
    let entry = edge.visible(&caller, &id).await?;
    let turn = turn_id(&turn)?;
    let versions = published(&edge, &entry).await?;
    let to = version_of(&versions, turn)?;
    let from = match query.from.as_deref() {
        Some(from) => {
            let from = query_turn(from)?;
            Some((from, version_of(&versions, from)?))
        }
        None => versions
            .range(..turn)
            .next_back()
            .map(|(t, (v, _))| (*t, *v)),
    };
    let changes = lineage(&edge, &entry)
        .diff(from.map(|(_, v)| v), to)
        .await?;
    Ok(Json(VersionDiff {
        from: from.map(|(t, _)| t.to_string()),
        to: turn.to_string(),
        changes: changes
            .into_iter()
            .map(|c| FileChangeView {
                path: c.path,
                change: c.change.as_str().to_owned(),
                patch: c.patch,
                binary: c.binary,
            })
            .collect(),
    }))
}

/// Every version the record's `turn_complete` entries name, by turn, with the completion time.
async fn published(
    edge: &Edge,
    entry: &DirectoryEntry,
) -> ApiResult<BTreeMap<TurnId, (ProjectVersion, u64)>> {
    let entries = edge.record(entry).entries().await?;
    let mut versions = BTreeMap::new();
    for e in &entries {
        if let EntryBody::TurnComplete(c) = &e.body {
            if let Some(v) = c.version {
                versions.insert(c.turn, (v, c.at_ms));
            }
        }
    }
    Ok(versions)
}

fn version_of(
    versions: &BTreeMap<TurnId, (ProjectVersion, u64)>,
    turn: TurnId,
) -> ApiResult<ProjectVersion> {
    versions
        .get(&turn)
        .map(|(v, _)| *v)
        .ok_or_else(|| ApiError::not_found(format!("{turn} published no project version")))
}

/// A turn from the path: one that cannot be a turn is `404`, like a turn without a version.
fn turn_id(text: &str) -> ApiResult<TurnId> {
    text.parse()
        .map_err(|_| ApiError::not_found(format!("{text:?} is not a turn (turn_<n>)")))
}

/// A turn from the query (`from`, whose pattern the schema declares): `422` when malformed.
fn query_turn(text: &str) -> ApiResult<TurnId> {
    text.parse()
        .map_err(|_| ApiError::invalid(format!("{text:?} is not a turn (turn_<n>)")))
}

fn lineage(edge: &Edge, entry: &DirectoryEntry) -> Lineage {
    Lineage::new(
        edge.inner.conversations.store().clone(),
        entry.prefix().clone(),
    )
}

/// The reference of a version's file, if a reference can name its path.
fn reference(entry: &DirectoryEntry, turn: TurnId, path: &str) -> Option<String> {
    let path = RefPath::from_segments(path.split('/')).ok()?;
    Some(Reference::new(Family::git(), entry.conversation, turn, path).to_string())
}
