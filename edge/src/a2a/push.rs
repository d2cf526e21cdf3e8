//! A2A push notifications: a task's `TaskPushNotificationConfig` is a webhook subscription of
//! the task's conversation that speaks A2A — the workers deliver it like every webhook (at
//! least once, retried with backoff, dead-lettered, to addresses the outbound rules allow), as
//! `statusUpdate` events of the task, with the client's token in `X-A2A-Notification-Token`
//! and its `authentication` in `Authorization`, signed (Standard Webhooks headers) with the
//! token as the key. It ends with the task. Only the conversation's owner registers one (a
//! subscription hears of what its maker owns).

use serde_json::{json, Value};
use turnpike_artifactory::webhooks::{A2aPush, SigningSecret, Subscription};
use turnpike_artifactory::DirectoryEntry;
use turnpike_schemas::webhook::EventKind;

use super::wire::{Code, RpcError};
use crate::auth::Principal;
use crate::state::Edge;
use turnpike_artifactory::tasks::TaskRef;

/// The longest token or credentials taken, in bytes.
const MAX_SECRET_BYTES: usize = 1024;
/// The longest config id.
const MAX_ID_BYTES: usize = 128;

fn text<'a>(v: &'a Value, name: &str) -> Result<Option<&'a str>, RpcError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(RpcError::params(format!("{name} is a string"))),
    }
}

/// The config as A2A shows it (never the token or the credentials).
fn config_of(s: &Subscription) -> Option<Value> {
    let push = s.a2a.as_ref()?;
    let mut config = json!({"id": push.config, "taskId": push.task, "url": s.url});
    if let Some(scheme) = push
        .authorization
        .as_deref()
        .and_then(|a| a.split_once(' '))
        .map(|(scheme, _)| scheme)
    {
        config["authentication"] = json!({ "scheme": scheme });
    }
    Some(config)
}

fn unavailable(e: turnpike_artifactory::Error) -> RpcError {
    match e.kind() {
        turnpike_artifactory::ErrorKind::Key => RpcError::new(
            Code::PushNotSupported,
            "push notifications need the deployment's connection key, which is not set",
        ),
        turnpike_artifactory::ErrorKind::InvalidInput => RpcError::params(e.to_string()),
        _ => RpcError::new(Code::Internal, e.to_string()),
    }
}

/// A config, checked.
pub(super) struct Parsed {
    url: String,
    token: Option<String>,
    id: Option<String>,
    authorization: Option<String>,
}

/// Checks `config` (`{url, token?, authentication?: {scheme, credentials}, id?}`) before
/// anything is sent: a config that cannot be kept refuses its message too.
pub(super) fn parse(config: &Value) -> Result<Parsed, RpcError> {
    if !config.is_object() {
        return Err(RpcError::params("a push notification config is an object"));
    }
    let url = text(config, "url")?.ok_or_else(|| RpcError::params("url is required"))?;
    turnpike_artifactory::webhooks::check_url(url)
        .map_err(|e| RpcError::params(format!("url: {e}")))?;
    let token = text(config, "token")?;
    let id = text(config, "id")?;
    if token.is_some_and(|t| t.len() > MAX_SECRET_BYTES)
        || id.is_some_and(|i| i.len() > MAX_ID_BYTES)
    {
        return Err(RpcError::params("the token or the id is too long"));
    }
    let authorization = match config.get("authentication") {
        None | Some(Value::Null) => None,
        Some(auth) => {
            let scheme = text(auth, "scheme")?
                .ok_or_else(|| RpcError::params("authentication.scheme is required"))?;
            let credentials = text(auth, "credentials")?.unwrap_or_default();
            let ok = |s: &str| {
                s.len() <= MAX_SECRET_BYTES && s.bytes().all(|b| (0x21..0x7f).contains(&b))
            };
            if !ok(scheme) || !ok(credentials) {
                return Err(RpcError::params(
                    "authentication is printable ASCII without spaces",
                ));
            }
            Some(format!("{scheme} {credentials}").trim_end().to_owned())
        }
    };
    Ok(Parsed {
        url: url.to_owned(),
        token: token.map(str::to_owned),
        id: id.map(str::to_owned),
        authorization,
    })
}

/// Registers `config` for `task` of `entry`, as `caller` (the conversation's owner only).
pub(super) async fn create(
    edge: &Edge,
    caller: &Principal,
    task: TaskRef,
    entry: &DirectoryEntry,
    config: Parsed,
) -> Result<Value, RpcError> {
    if entry.owner != caller.identity {
        return Err(RpcError::params(
            "push notifications are for the conversation's owner",
        ));
    }
    let Parsed {
        url,
        token,
        id,
        authorization,
    } = config;
    let secret = match &token {
        Some(token) => SigningSecret::of_key(token.as_bytes()).map_err(unavailable)?,
        None => SigningSecret::fresh().map_err(unavailable)?,
    };
    let push = A2aPush {
        task: task.to_string(),
        config: id.unwrap_or_default(),
        token: token.is_some(),
        authorization,
        ended: false,
    };
    let (mut subscription, _) = edge
        .inner
        .conversations
        .webhooks()
        .create_with(
            &caller.tenant,
            &caller.identity,
            &url,
            vec![
                EventKind::TurnCompleted,
                EventKind::TurnFailed,
                EventKind::TurnCancelled,
                EventKind::TurnParked,
            ],
            Some(task.conversation),
            Some(push),
            secret,
        )
        .await
        .map_err(unavailable)?;
    // Workers see a subscription made now from about SUBSCRIBERS_FRESH on: a task that ends
    // sooner is told once that has passed, from here (the same message id as a worker's, so
    // whichever comes second is the same delivery).
    let (edge2, record) = (edge.clone(), edge.record(entry));
    let (tenant, owner, id) = (
        caller.tenant.clone(),
        caller.identity.clone(),
        subscription.id.clone(),
    );
    tokio::spawn(async move {
        tokio::time::sleep(CATCH_UP).await;
        if let Err(e) = catch_up(&edge2, &record, task, &tenant, &owner, &id).await {
            tracing::warn!(%task, error = %e, "cannot catch up on a push notification config");
        }
    });
    // No id from the client: the subscription's names the config.
    if let Some(push) = subscription.a2a.as_mut().filter(|p| p.config.is_empty()) {
        push.config = subscription.id.clone();
    }
    config_of(&subscription).ok_or_else(|| RpcError::new(Code::Internal, "no config"))
}

/// How long after a config is made the edge looks whether its task settled unseen: past the
/// workers' subscriber cache.
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

/// Enqueues the latest end of `task`'s turns for subscription `id` if the task is settled and
/// the subscription has heard nothing of it (it is still there, not ended).
async fn catch_up(
    edge: &Edge,
    record: &turnpike_artifactory::Record,
    task: TaskRef,
    tenant: &turnpike_schemas::TenantId,
    owner: &turnpike_schemas::Identity,
    id: &str,
) -> turnpike_artifactory::Result<()> {
    use turnpike_artifactory::tasks::{Said, TaskState};
    use turnpike_artifactory::webhooks::{turn_message_id, Delivery, Message, Subscriber};
    let webhooks = edge.inner.conversations.webhooks();
    let Some((subscription, _)) = webhooks.with_secret(tenant, owner, id).await? else {
        return Ok(());
    };
    if subscription.a2a.as_ref().is_none_or(|p| p.ended) {
        return Ok(());
    }
    let Some(view) = turnpike_artifactory::tasks::read(record, task).await? else {
        return Ok(());
    };
    let Some(turn) = view.turn() else {
        return Ok(());
    };
    let kind = match view.state {
        TaskState::Completed => EventKind::TurnCompleted,
        TaskState::Failed | TaskState::Rejected => EventKind::TurnFailed,
        TaskState::Canceled => EventKind::TurnCancelled,
        // A park told by a worker and delivered leaves nothing to tell it apart from one
        // missed: only the end is caught up on (the subscription ends with it).
        TaskState::InputRequired
        | TaskState::AuthRequired
        | TaskState::Submitted
        | TaskState::Working => return Ok(()),
    };
    let reply = view.history.iter().rev().find_map(|s| match s {
        Said::Agent { text, turn: t, .. } if *t == turn => Some(text.clone()),
        _ => None,
    });
    let message = Message {
        id: turn_message_id(tenant, task.conversation, turn),
        kind,
        at_ms: view.at_ms,
        data: json!({
            "conversation": task.conversation.to_string(),
            "turn": turn.to_string(),
            "reply": reply,
            "error": view.reason,
        }),
    };
    let delivery = Delivery::new(
        tenant.clone(),
        Subscriber::User {
            owner: owner.clone(),
            id: id.to_owned(),
        },
        message,
    );
    // Made create-only: a worker's enqueued delivery of the same message is the same object.
    webhooks.enqueue(&delivery, view.at_ms).await?;
    webhooks.end_push(tenant, owner, id).await?;
    Ok(())
}

/// The caller's configs of `task`.
async fn of_task(
    edge: &Edge,
    caller: &Principal,
    task: TaskRef,
) -> Result<Vec<Subscription>, RpcError> {
    let all = edge
        .inner
        .conversations
        .webhooks()
        .list(&caller.tenant, &caller.identity)
        .await
        .map_err(unavailable)?;
    let task = task.to_string();
    Ok(all
        .into_iter()
        .filter_map(|mut s| {
            let push = s.a2a.as_mut()?;
            if push.task != task {
                return None;
            }
            if push.config.is_empty() {
                push.config = s.id.clone();
            }
            Some(s)
        })
        .collect())
}

/// Config `id` of `task`.
pub(super) async fn get(
    edge: &Edge,
    caller: &Principal,
    task: TaskRef,
    id: &str,
) -> Result<Value, RpcError> {
    of_task(edge, caller, task)
        .await?
        .iter()
        .find(|s| s.a2a.as_ref().is_some_and(|p| p.config == id))
        .and_then(config_of)
        .ok_or_else(|| {
            RpcError::new(
                Code::TaskNotFound,
                format!("no push notification config {id:?} for task {task}"),
            )
        })
}

/// Every config of `task`.
pub(super) async fn list(
    edge: &Edge,
    caller: &Principal,
    task: TaskRef,
) -> Result<Value, RpcError> {
    let configs: Vec<Value> = of_task(edge, caller, task)
        .await?
        .iter()
        .filter_map(config_of)
        .collect();
    Ok(json!({"configs": configs, "nextPageToken": ""}))
}

/// Deletes config `id` of `task`.
pub(super) async fn delete(
    edge: &Edge,
    caller: &Principal,
    task: TaskRef,
    id: &str,
) -> Result<Value, RpcError> {
    let found = of_task(edge, caller, task).await?;
    let Some(s) = found
        .iter()
        .find(|s| s.a2a.as_ref().is_some_and(|p| p.config == id))
    else {
        return Err(RpcError::new(
            Code::TaskNotFound,
            format!("no push notification config {id:?} for task {task}"),
        ));
    };
    edge.inner
        .conversations
        .webhooks()
        .remove(&caller.tenant, &caller.identity, &s.id)
        .await
        .map_err(unavailable)?;
    Ok(Value::Null)
}
