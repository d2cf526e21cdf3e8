//! Apps, and conversations: create, list, get, close, share.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use turnpike_artifactory::{DirectoryEntry, Head, NewConversation, Record};
use turnpike_schemas::{AgentId, AppId, ConversationId, Identity};

use super::error::{ApiError, ApiResult, ErrorBody};
use super::model::{
    AppList, ConversationList, ConversationView, CreateConversation, GrantInput, GrantView,
    ListConversations, Status,
};
use crate::extract::{conversation_id, Body, Caller, Params};
use crate::state::Edge;
use turnpike_router::bus::now_ms;

/// The longest instructions a conversation may be created with, in bytes.
pub const MAX_INSTRUCTIONS_BYTES: usize = 16 * 1024;

/// The apps and agents this deployment hosts for the caller's tenant.
#[utoipa::path(get, path = "/v1/apps", tag = "apps",
    responses((status = 200, body = AppList)))]
pub async fn list_apps(State(edge): State<Edge>, Caller(caller): Caller) -> Json<AppList> {
    Json(AppList {
        apps: edge.apps_for(&caller.tenant),
    })
}

/// Creates a conversation owned by the caller, in the caller's tenant.
#[utoipa::path(post, path = "/v1/conversations", tag = "conversations",
    request_body = CreateConversation,
    responses((status = 201, body = ConversationView), (status = 422, body = ErrorBody)))]
pub async fn create(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Body(input): Body<CreateConversation>,
) -> ApiResult<(StatusCode, Json<ConversationView>)> {
    let app: AppId = input
        .app
        .parse()
        .map_err(|e| ApiError::invalid(format!("app: {e}")))?;
    let agent: AgentId = input
        .agent
        .parse()
        .map_err(|e| ApiError::invalid(format!("agent: {e}")))?;
    edge.check_agent(&caller.tenant, &app, &agent)?;
    if let Some(text) = &input.instructions {
        if text.len() > MAX_INSTRUCTIONS_BYTES {
            return Err(ApiError::invalid(format!(
                "the instructions are {} bytes, more than the limit of {MAX_INSTRUCTIONS_BYTES}",
                text.len()
            ))
            .with_details(serde_json::json!({ "limit_bytes": MAX_INSTRUCTIONS_BYTES })));
        }
    }
    let (entry, head) = edge
        .open_conversation(
            &caller,
            app,
            agent,
            input.instructions.filter(|t| !t.trim().is_empty()),
        )
        .await?;
    // Just created: the head is the one the creation wrote, and it is not closed.
    Ok((StatusCode::CREATED, Json(view_of(entry, &head, None))))
}

impl Edge {
    /// Creates a conversation owned by `caller` with an agent the caller has checked.
    pub(crate) async fn open_conversation(
        &self,
        caller: &crate::auth::Principal,
        app: AppId,
        agent: AgentId,
        instructions: Option<String>,
    ) -> ApiResult<(DirectoryEntry, Head)> {
        let (entry, _, head) = self
            .inner
            .conversations
            .create(
                &self.inner.signer,
                NewConversation {
                    tenant: caller.tenant.clone(),
                    owner: caller.identity.clone(),
                    app,
                    agent,
                    at_ms: now_ms(),
                    instructions,
                    started_by: None,
                },
            )
            .await?;
        Ok((entry, head))
    }
}

/// The caller's conversations, newest first.
#[utoipa::path(get, path = "/v1/conversations", tag = "conversations",
    params(ListConversations),
    responses((status = 200, body = ConversationList)))]
pub async fn list(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Params(query): Params<ListConversations>,
) -> ApiResult<Json<ConversationList>> {
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be 1–100, not {limit}"
        )));
    }
    let limit = limit as usize;
    let before: Option<ConversationId> = match &query.before {
        Some(text) => Some(text.parse().map_err(|_| {
            ApiError::malformed(format!("before: {text:?} is not a conversation id"))
        })?),
        None => None,
    };
    let directory = edge.inner.conversations.directory();
    let ids: Vec<ConversationId> = directory
        .owned(&caller.identity)
        .await?
        .into_iter()
        .filter(|id| before.is_none_or(|b| *id < b))
        .take(limit + 1)
        .collect();
    let more = ids.len() > limit;
    let mut conversations = Vec::with_capacity(limit);
    for id in ids.into_iter().take(limit) {
        // The owner index is by identity; the same identity in another tenant is someone else.
        match directory.lookup(id, &caller.tenant, &caller.identity).await {
            Ok(entry) => conversations.push(edge.view(entry).await?),
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let next_before = more
        .then(|| conversations.last().map(|c| c.id.clone()))
        .flatten();
    Ok(Json(ConversationList {
        conversations,
        next_before,
    }))
}

/// One conversation.
#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "conversations",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = ConversationView), (status = 404, body = ErrorBody)))]
pub async fn get_one(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ConversationView>> {
    let entry = edge.visible(&caller, &id).await?;
    Ok(Json(edge.view(entry).await?))
}

/// Closes a conversation (owner only): it stays readable and accepts no more events.
#[utoipa::path(post, path = "/v1/conversations/{id}/close", tag = "conversations",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = ConversationView), (status = 404, body = ErrorBody)))]
pub async fn close(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ConversationView>> {
    let entry = edge.owned(&caller, &id).await?;
    edge.inner
        .conversations
        .directory()
        .close(entry.conversation, now_ms())
        .await?;
    edge.inner.ingress.forget_open(entry.conversation);
    Ok(Json(edge.view(entry).await?))
}

/// Exports a conversation as one archive, a tar file (its owner, or an admin of its tenant):
/// the record (verifiable offline with the public key the archive carries), turn logs, files,
/// attachments and the project as a git bundle. `turnpike conversation import` restores it
/// into another deployment. Work in progress (a running turn, events not taken yet) makes it
/// `409`: retry once it is done.
#[utoipa::path(get, path = "/v1/conversations/{id}/export", tag = "conversations",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, content_type = "application/x-tar", body = Vec<u8>),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn export(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse as _;
    use std::io::Seek as _;
    let entry = edge.owned_or_administered(&caller, &id).await?;
    let conversation = entry.conversation;
    let conversations = &edge.inner.conversations;
    let keys = conversations
        .trusted_keys()
        .ok_or_else(|| ApiError::unavailable("this deployment trusts no keys to export with"))?;
    let unavailable = |e: std::io::Error| ApiError::unavailable(format!("a temporary file: {e}"));
    let file = tempfile::tempfile().map_err(unavailable)?;
    let mut reader = file.try_clone().map_err(unavailable)?;
    let lane_last = edge.inner.bus.lane_last(conversation).await?;
    turnpike_artifactory::archive::export(
        conversations,
        &entry,
        keys,
        &edge.inner.signer,
        Some(lane_last),
        &caller.identity.to_string(),
        file,
    )
    .await
    .map_err(|e| match e.kind() {
        turnpike_artifactory::ErrorKind::HeadMoved => ApiError::conflict(e.to_string()),
        _ => ApiError::unavailable(e.to_string()),
    })?;
    reader.rewind().map_err(unavailable)?;
    let body = axum::body::Body::from_stream(file_chunks(tokio::fs::File::from_std(reader)));
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/x-tar".to_owned(),
            ),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{conversation}.tar\""),
            ),
        ],
        body,
    )
        .into_response())
}

/// A file's bytes as a stream of chunks.
fn file_chunks(
    file: tokio::fs::File,
) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send {
    futures::stream::try_unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt as _;
        let mut chunk = bytes::BytesMut::with_capacity(64 * 1024);
        match file.read_buf(&mut chunk).await? {
            0 => Ok(None),
            _ => Ok(Some((chunk.freeze(), file))),
        }
    })
}

/// Deletes a conversation from every store — its record, turn logs, files, attachments,
/// project versions, index rows, grants, directory entry, the rest of its lane (its owner, or
/// an admin of its tenant). A tombstone outside the deleted data keeps who, when, why and the
/// record's final root. A turn still running after a few seconds makes it `409`: retry once it
/// ends, or stop it first.
#[utoipa::path(delete, path = "/v1/conversations/{id}", tag = "conversations",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = crate::model::TombstoneView), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn delete(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<crate::model::TombstoneView>> {
    let entry = edge.owned_or_administered(&caller, &id).await?;
    let conversation = entry.conversation;
    let reason = if entry.owner == caller.identity {
        "erasure requested by the owner"
    } else {
        "erasure requested by an admin of the tenant"
    };
    let tombstone = edge
        .eraser()
        .erase(&entry, &caller.identity.to_string(), reason)
        .await
        .map_err(|e| match e {
            turnpike_lifecycle::erasure::ErasureError::Busy => ApiError::conflict(e.to_string()),
            turnpike_lifecycle::erasure::ErasureError::Gone => {
                ApiError::not_found(format!("no conversation {conversation}"))
            }
            turnpike_lifecycle::erasure::ErasureError::Failed(_) => {
                ApiError::unavailable(e.to_string())
            }
        })?;
    edge.inner.ingress.forget(conversation);
    Ok(Json(tombstone.into()))
}

/// Who the caller is: the identity and tenant the bearer token stands for, and whether it is an
/// admin of that tenant (a client shows admin actions only then; the API checks regardless).
#[utoipa::path(get, path = "/v1/me", tag = "conversations",
    responses((status = 200, body = crate::model::MeView)))]
pub async fn me(Caller(caller): Caller) -> Json<crate::model::MeView> {
    Json(crate::model::MeView {
        identity: caller.identity.to_string(),
        tenant: caller.tenant.to_string(),
        admin: caller.admin,
    })
}

/// How long a deletion through the API waits for owners finishing a turn.
const ERASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Erases everything of the caller's (a data-protection request): every conversation they own,
/// as `DELETE /v1/conversations/{id}` does, their connections, schedules and webhook
/// subscriptions, and everything the index
/// remembers of them. A conversation with a turn still running after a few seconds makes it
/// `409` once the others are deleted: retry.
#[utoipa::path(delete, path = "/v1/me", tag = "conversations",
    responses((status = 200, body = crate::model::ErasedView),
              (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn delete_me(
    State(edge): State<Edge>,
    Caller(caller): Caller,
) -> ApiResult<Json<crate::model::ErasedView>> {
    let directory = edge.inner.conversations.directory();
    // The user's connections go with them (sealed credentials and waiting marks), first: a
    // request cut short by a client that stops waiting has erased them anyway.
    if let Some(connections) = edge.inner.conversations.connections() {
        connections
            .erase(&caller.tenant, &caller.identity)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))?;
    }
    // Their webhook subscriptions, and the deliveries to them (waiting or dead): nothing more
    // of theirs is told to anyone, and nothing they were told stays behind.
    edge.inner
        .conversations
        .webhooks()
        .erase_owner(&caller.tenant, &caller.identity)
        .await?;
    // Their schedules next: nothing fires into what is being deleted, nor starts new
    // conversations of theirs afterwards.
    let schedules = turnpike_artifactory::Schedules::new(edge.inner.conversations.store().clone());
    for id in schedules.owned(&caller.tenant, &caller.identity).await? {
        match schedules
            .get_owned(id, &caller.tenant, &caller.identity)
            .await
        {
            Ok(schedule) => schedules.delete(&schedule).await?,
            Err(e) if e.kind() == turnpike_artifactory::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    // One wait for owners finishing turns, shared by every conversation (not one each).
    let deadline = tokio::time::Instant::now() + ERASE_WAIT;
    let mut deleted = Vec::new();
    let mut busy = Vec::new();
    for id in directory.owned(&caller.identity).await? {
        let eraser = edge
            .eraser()
            .with_busy_wait(deadline.saturating_duration_since(tokio::time::Instant::now()));
        // Owned in this tenant only: an identity's conversations elsewhere are not this call's.
        let Ok(entry) = directory
            .lookup_owned(id, &caller.tenant, &caller.identity)
            .await
        else {
            continue;
        };
        match eraser
            .erase(
                &entry,
                &caller.identity.to_string(),
                "erasure of everything of the user's, requested by the user",
            )
            .await
        {
            Ok(tombstone) => deleted.push(tombstone.into()),
            Err(turnpike_lifecycle::erasure::ErasureError::Busy) => busy.push(id.to_string()),
            Err(turnpike_lifecycle::erasure::ErasureError::Gone) => {}
            Err(e) => return Err(ApiError::unavailable(e.to_string())),
        }
        edge.inner.ingress.forget(id);
    }
    let mut forgotten = 0;
    if let Some(index) = &edge.inner.search {
        let scope = turnpike_index::Scope::new(caller.tenant.clone(), caller.identity.clone());
        forgotten = index
            .backend()
            .forget(&scope)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))?;
    }
    if !busy.is_empty() {
        return Err(ApiError::conflict(format!(
            "{} of your conversations have a running turn ({}); the other {} are deleted: retry",
            busy.len(),
            busy.join(", "),
            deleted.len()
        )));
    }
    Ok(Json(crate::model::ErasedView {
        conversations: deleted,
        forgotten,
    }))
}

/// Shares (`granted`) or unshares the conversation `id` of `caller` with `input`'s identity.
async fn set_grant(
    edge: &Edge,
    caller: &crate::auth::Principal,
    id: String,
    input: &GrantInput,
    granted: bool,
) -> ApiResult<Json<GrantView>> {
    let entry = edge.owned(caller, &id).await?;
    let who: Identity = input
        .identity
        .parse()
        .map_err(|e| ApiError::invalid(format!("identity: {e}")))?;
    if let Some(tenant) = &input.tenant {
        if tenant != entry.tenant.as_str() {
            return Err(ApiError::new(
                crate::error::ErrorCode::CrossTenant,
                format!(
                    "conversations of tenant {} cannot be shared with identities of tenant {tenant}",
                    entry.tenant
                ),
            ));
        }
    }
    let directory = edge.inner.conversations.directory();
    if granted {
        directory.grant(entry.conversation, &who).await?;
    } else {
        directory.revoke(entry.conversation, &who).await?;
        // Streams the grantee holds end at once (they also re-check on their next tick).
        let revoked = turnpike_schemas::live::LiveFrame::Revoked {
            identity: who.clone(),
        };
        edge.inner
            .bus
            .live(entry.conversation, revoked.to_bytes().into())
            .await;
    }
    Ok(Json(GrantView {
        conversation: id,
        identity: who.to_string(),
        granted,
    }))
}

/// Shares a conversation with another identity (owner only): it may then read and write it.
#[utoipa::path(post, path = "/v1/conversations/{id}/grants", tag = "conversations",
    params(("id" = String, Path, description = "conv_<ulid>")),
    request_body = GrantInput,
    responses((status = 200, body = GrantView), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn grant(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    Body(input): Body<GrantInput>,
) -> ApiResult<Json<GrantView>> {
    set_grant(&edge, &caller, id, &input, true).await
}

/// Takes a share back (owner only).
#[utoipa::path(delete, path = "/v1/conversations/{id}/grants", tag = "conversations",
    params(("id" = String, Path, description = "conv_<ulid>")),
    request_body = GrantInput,
    responses((status = 200, body = GrantView), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn revoke(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    Body(input): Body<GrantInput>,
) -> ApiResult<Json<GrantView>> {
    set_grant(&edge, &caller, id, &input, false).await
}

impl Edge {
    /// The conversation `id` if `caller` may see it; `404` otherwise, as for a missing one.
    pub(crate) async fn visible(
        &self,
        caller: &crate::auth::Principal,
        id: &str,
    ) -> ApiResult<DirectoryEntry> {
        let conversation = conversation_id(id)?;
        Ok(self
            .inner
            .conversations
            .directory()
            .lookup(conversation, &caller.tenant, &caller.identity)
            .await?)
    }

    /// The conversation `id` if `caller` owns it (sharing and closing are the owner's); `404`
    /// otherwise.
    pub(crate) async fn owned(
        &self,
        caller: &crate::auth::Principal,
        id: &str,
    ) -> ApiResult<DirectoryEntry> {
        let conversation = conversation_id(id)?;
        Ok(self
            .inner
            .conversations
            .directory()
            .lookup_owned(conversation, &caller.tenant, &caller.identity)
            .await?)
    }

    /// A conversation its owner, or an admin of its tenant, acts on (a grantee, a stranger and
    /// another tenant get 404).
    pub(crate) async fn owned_or_administered(
        &self,
        caller: &crate::auth::Principal,
        id: &str,
    ) -> ApiResult<DirectoryEntry> {
        if !caller.admin {
            return self.owned(caller, id).await;
        }
        self.administered(caller, id).await
    }

    /// What deletes conversations from every store this edge reaches.
    pub(crate) fn eraser(&self) -> turnpike_lifecycle::erasure::Eraser {
        turnpike_lifecycle::erasure::Eraser::new(
            self.inner.conversations.clone(),
            self.inner.bus.clone(),
            self.inner.search.clone(),
        )
        // An owner finishing the turn whose reply the caller just saw lets go within moments.
        .with_busy_wait(ERASE_WAIT)
    }

    /// The record of a visible conversation.
    pub(crate) fn record(&self, entry: &DirectoryEntry) -> Record {
        // Checked against the deployment's trusted keys: a head whose root is not signed by one
        // is refused, not shown.
        self.inner.conversations.record(entry.prefix())
    }

    /// A conversation as the API shows it: its head and whether it is closed, read now.
    pub(crate) async fn view(&self, entry: DirectoryEntry) -> ApiResult<ConversationView> {
        let head = self.record(&entry).head().await?;
        let closed_ms = self
            .inner
            .conversations
            .directory()
            .closed_at(entry.conversation)
            .await?;
        Ok(view_of(entry, &head, closed_ms))
    }
}

/// A conversation as the API shows it, from its directory entry, a head and its closing time.
fn view_of(entry: DirectoryEntry, head: &Head, closed_ms: Option<u64>) -> ConversationView {
    let state = head.state();
    let status = if closed_ms.is_some() {
        Status::Closed
    } else if state.turn_open {
        Status::Running
    } else if state.idle_closed {
        Status::IdleClosed
    } else if state.waiting {
        Status::Waiting
    } else {
        Status::Idle
    };
    ConversationView {
        id: entry.conversation.to_string(),
        tenant: entry.tenant.to_string(),
        owner: entry.owner.to_string(),
        app: entry.app.to_string(),
        agent: state
            .active_agent
            .as_ref()
            .unwrap_or(&entry.agent)
            .to_string(),
        status,
        messages: state.messages,
        turns: state.last_turn,
        through: head.leaves(),
        created_ms: entry.created_ms,
        active_ms: state.active_ms.max(entry.created_ms),
        closed_ms,
        instructions: entry.instructions,
        started_by: entry.started_by.map(|o| serde_json::json!(o)),
    }
}

impl Edge {
    /// The apps hosted now that `tenant` may use (what one tenant may use says nothing to
    /// another: every listing and refusal goes through this).
    pub(crate) fn apps_for(
        &self,
        tenant: &turnpike_schemas::TenantId,
    ) -> Vec<crate::model::AppView> {
        self.inner
            .apps
            .apps()
            .into_iter()
            .filter(|a| a.offered_to(tenant.as_str()))
            .collect()
    }

    /// Refuses an app or agent this deployment does not host for `tenant` (`404`); what it
    /// names are only the apps offered to that tenant.
    pub(crate) fn check_agent(
        &self,
        tenant: &turnpike_schemas::TenantId,
        app: &AppId,
        agent: &AgentId,
    ) -> ApiResult<()> {
        let catalog = self.apps_for(tenant);
        let Some(found) = catalog.iter().find(|a| a.id == app.as_str()) else {
            return Err(ApiError::not_found(format!(
                "app {app:?} is not hosted here (hosted: {})",
                catalog
                    .iter()
                    .map(|a| a.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        // A native app (no declared agents) takes any agent name.
        if !found.agents.is_empty() && !found.agents.iter().any(|a| a.id == agent.as_str()) {
            return Err(ApiError::not_found(format!(
                "app {app} has no agent {agent:?} (agents: {})",
                found
                    .agents
                    .iter()
                    .map(|a| a.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(())
    }
}
