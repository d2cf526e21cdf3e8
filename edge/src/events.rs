//! Events into a conversation (messages, follow-ups, steers, stops, answers, switches,
//! compaction) and rows out of it (the replay cursor, paging backwards, what is pending).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use turnpike_schemas::entry::TurnOutcome;
use turnpike_schemas::{EntryBody, EventBody, RequestId};

use super::error::{ApiError, ApiResult, ErrorBody};
use super::model::{
    Accepted, AnswerInput, ApprovalInput, ApprovalView, ListRows, Pending, QuestionView, Row,
    RowPage, StopInput, SwitchInput, TextInput,
};
use crate::auth::Principal;
use crate::extract::{conversation_id, Body, Caller, Params};
use crate::state::Edge;

/// The header a client sets to make a submission safe to retry.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl Edge {
    /// Submits one event as the caller: `202` once it is durable on the lane. Counted:
    /// accepted by kind, refused by reason.
    pub(crate) async fn submit(
        &self,
        caller: &Principal,
        id: &str,
        headers: &HeaderMap,
        body: EventBody,
    ) -> ApiResult<(StatusCode, Json<Accepted>)> {
        let kind = body.kind_name();
        // The trace of a turn starts here; the event carries it to the worker.
        let span = tracing::info_span!(
            "turnpike.accept",
            otel.name = %format!("accept {kind}"),
            otel.kind = "server",
            turnpike.conversation = %id,
            turnpike.event = kind,
        );
        let result = {
            use tracing::Instrument as _;
            self.submit_uncounted(caller, id, headers, body)
                .instrument(span)
                .await
        };
        match &result {
            Ok(_) => metrics::counter!("turnpike_submissions_total", "kind" => kind).increment(1),
            Err(e) => {
                metrics::counter!("turnpike_rejections_total", "reason" => e.body.code.clone())
                    .increment(1)
            }
        }
        result
    }

    async fn submit_uncounted(
        &self,
        caller: &Principal,
        id: &str,
        headers: &HeaderMap,
        body: EventBody,
    ) -> ApiResult<(StatusCode, Json<Accepted>)> {
        let conversation = conversation_id(id)?;
        let key = match headers.get(IDEMPOTENCY_KEY) {
            Some(v) => Some(
                v.to_str()
                    .map_err(|_| ApiError::invalid("the Idempotency-Key must be printable ASCII"))?
                    .to_owned(),
            ),
            None => None,
        };
        let _slot = self.inner.in_flight.enter().await?;
        let (event, published) = self
            .inner
            .ingress
            .submit(&caller.tenant, &caller.identity, conversation, body, key)
            .await?;
        Ok((
            StatusCode::ACCEPTED,
            Json(Accepted {
                conversation: conversation.to_string(),
                event_id: event.id.to_string(),
                kind: event.body.kind_name().to_owned(),
                lane_seq: published.seq,
                duplicate: published.duplicate,
            }),
        ))
    }
}

/// Sends a message: it starts the next turn (or waits for the running one to end).
#[utoipa::path(post, path = "/v1/conversations/{id}/messages", tag = "events",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("Idempotency-Key" = Option<String>, Header, description = "1–128 printable ASCII characters; a retry with the same key is accepted once")),
    request_body = TextInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn message(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(input): Body<TextInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    edge.submit(
        &caller,
        &id,
        &headers,
        EventBody::Message {
            text: input.checked()?,
        },
    )
    .await
}

/// Adds to the running turn; it is folded in between model rounds.
#[utoipa::path(post, path = "/v1/conversations/{id}/follow-ups", tag = "events",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body = TextInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody)))]
pub async fn follow_up(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(input): Body<TextInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    edge.submit(
        &caller,
        &id,
        &headers,
        EventBody::FollowUp {
            text: input.checked()?,
        },
    )
    .await
}

/// Redirects the running turn's next round.
#[utoipa::path(post, path = "/v1/conversations/{id}/steer", tag = "events",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body = TextInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody)))]
pub async fn steer(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(input): Body<TextInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    edge.submit(
        &caller,
        &id,
        &headers,
        EventBody::Steer {
            text: input.checked()?,
        },
    )
    .await
}

/// Cancels the running turn (its model stream and any running cell).
#[utoipa::path(post, path = "/v1/conversations/{id}/stop", tag = "events",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body = StopInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody)))]
pub async fn stop(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(input): Body<StopInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    edge.submit(
        &caller,
        &id,
        &headers,
        EventBody::Stop {
            reason: input.reason,
        },
    )
    .await
}

fn request_id(text: &str) -> ApiResult<RequestId> {
    text.parse()
        .map_err(|_| ApiError::not_found(format!("request {text:?} not found")))
}

async fn answer_approval(
    edge: &Edge,
    caller: &Principal,
    id: &str,
    request: &str,
    headers: &HeaderMap,
    input: ApprovalInput,
    approve: bool,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    let request_id = request_id(request)?;
    edge.submit(
        caller,
        id,
        headers,
        EventBody::ApprovalResponse {
            request_id,
            approve,
            reason: input.reason,
            tool: input.tool,
            arguments: input.arguments,
        },
    )
    .await
}

/// Approves a pending call. The worker checks that the request is pending and that the caller
/// may answer it; a refused answer is recorded with its reason.
#[utoipa::path(post, path = "/v1/conversations/{id}/approvals/{request}/approve", tag = "people",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("request" = String, Path, description = "the approval request's id"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body = ApprovalInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody)))]
pub async fn approve(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((id, request)): Path<(String, String)>,
    headers: HeaderMap,
    Body(input): Body<ApprovalInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    answer_approval(&edge, &caller, &id, &request, &headers, input, true).await
}

/// Rejects a pending call, with an optional reason the agent sees.
#[utoipa::path(post, path = "/v1/conversations/{id}/approvals/{request}/reject", tag = "people",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("request" = String, Path, description = "the approval request's id"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body = ApprovalInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody)))]
pub async fn reject(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((id, request)): Path<(String, String)>,
    headers: HeaderMap,
    Body(input): Body<ApprovalInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    answer_approval(&edge, &caller, &id, &request, &headers, input, false).await
}

/// Answers a question the agent asked.
#[utoipa::path(post, path = "/v1/conversations/{id}/questions/{request}/answer", tag = "people",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("request" = String, Path, description = "the question's request id"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body = AnswerInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody)))]
pub async fn answer(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path((id, request)): Path<(String, String)>,
    headers: HeaderMap,
    Body(input): Body<AnswerInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    let request_id = request_id(&request)?;
    edge.submit(
        &caller,
        &id,
        &headers,
        EventBody::QuestionResponse {
            request_id,
            answer: input.answer,
        },
    )
    .await
}

/// Hands the conversation to another agent of its app (what is pending is rejected).
#[utoipa::path(post, path = "/v1/conversations/{id}/agent", tag = "events",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    request_body = SwitchInput,
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn switch_agent(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(input): Body<SwitchInput>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    let entry = edge.visible(&caller, &id).await?;
    let agent = input
        .agent
        .parse()
        .map_err(|e| ApiError::invalid(format!("agent: {e}")))?;
    edge.check_agent(&caller.tenant, &entry.app, &agent)?;
    edge.submit(&caller, &id, &headers, EventBody::SwitchAgent { agent })
        .await
}

/// Summarises older turns now (the next turn's context starts from the summary).
#[utoipa::path(post, path = "/v1/conversations/{id}/compact", tag = "events",
    params(("id" = String, Path, description = "conv_<ulid>"),
           ("Idempotency-Key" = Option<String>, Header, description = "see messages")),
    responses((status = 202, body = Accepted), (status = 404, body = ErrorBody)))]
pub async fn compact(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    edge.submit(&caller, &id, &headers, EventBody::Compact {})
        .await
}

/// The most entries one page reads.
const MAX_PAGE: u32 = 500;

/// Committed rows, read from the record: `after` a cursor (forwards), or `before` one
/// (backwards: the rows just before it, in record order; follow `prev_before` for older ones).
#[utoipa::path(get, path = "/v1/conversations/{id}/messages", tag = "events",
    params(("id" = String, Path, description = "conv_<ulid>"), ListRows),
    responses((status = 200, body = RowPage), (status = 404, body = ErrorBody)))]
pub async fn list_rows(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    Params(query): Params<ListRows>,
) -> ApiResult<Json<RowPage>> {
    let entry = edge.visible(&caller, &id).await?;
    const MAX_SEQ: u64 = (1 << 53) - 1;
    if query.after.max(query.before).is_some_and(|s| s > MAX_SEQ) {
        return Err(ApiError::invalid(format!(
            "after and before are at most {MAX_SEQ}"
        )));
    }
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be 1–{MAX_PAGE}, not {limit}"
        )));
    }
    let limit = limit as usize;
    let record = edge.record(&entry);
    let page = match (query.after, query.before) {
        // Both: the rows between the two, forwards from `after`.
        (Some(after), Some(before)) => {
            let mut page = record.page_from(after, limit).await?;
            page.entries.retain(|e| e.position + 1 < before);
            page
        }
        (None, Some(before)) => record.page_before(before.saturating_sub(1), limit).await?,
        (after, None) => record.page_from(after.unwrap_or(0), limit).await?,
    };
    let through = page.leaves;
    let first = page.entries.first().map(|e| e.position + 1);
    let last = page.entries.last().map(|e| e.position + 1);
    let rows: Vec<Row> = page.entries.iter().filter_map(Row::of).collect();
    Ok(Json(RowPage {
        rows,
        through,
        next_after: last.filter(|l| *l < through),
        prev_before: first.filter(|f| *f > 1),
    }))
}

/// How far back `pending` reads (entries).
const MAX_PENDING_SCAN: usize = 4096;

/// Approval requests and questions waiting for an answer.
#[utoipa::path(get, path = "/v1/conversations/{id}/pending", tag = "people",
    params(("id" = String, Path, description = "conv_<ulid>")),
    responses((status = 200, body = Pending), (status = 404, body = ErrorBody)))]
pub async fn pending(
    State(edge): State<Edge>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Pending>> {
    let entry = edge.visible(&caller, &id).await?;
    let record = edge.record(&entry);
    // Nothing waits unless the last turn parked (a new turn rejects what was pending).
    if !record.head().await?.state().waiting {
        return Ok(Json(Pending {
            approvals: Vec::new(),
            questions: Vec::new(),
        }));
    }
    // Requests live in the latest run of parked turns: read back to the last turn that ended
    // otherwise (or the beginning), then replay requests and answers in order — at most
    // `MAX_PENDING_SCAN` entries back, so a long run of parked turns costs a bounded read.
    let mut entries = Vec::new();
    let mut before = u64::MAX;
    'read: loop {
        if entries.len() >= MAX_PENDING_SCAN {
            break;
        }
        let page = record.page_before(before, 64).await?;
        let Some(first) = page.entries.first() else {
            break;
        };
        before = first.position;
        let mut chunk = page.entries;
        for (i, e) in chunk.iter().enumerate().rev() {
            if let EntryBody::TurnComplete(c) = &e.body {
                if c.outcome != TurnOutcome::Parked {
                    let rest = chunk.split_off(i + 1);
                    entries.splice(0..0, rest);
                    break 'read;
                }
            }
        }
        entries.splice(0..0, chunk);
        if before == 0 {
            break;
        }
    }
    let mut approvals: Vec<ApprovalView> = Vec::new();
    let mut questions: Vec<QuestionView> = Vec::new();
    for e in &entries {
        match &e.body {
            EntryBody::ApprovalRequest(r) => approvals.push(ApprovalView {
                request_id: r.request_id.to_string(),
                turn: r.turn.to_string(),
                tool: r.tool.clone(),
                arguments: r.arguments.clone(),
                approvers: r.approvers.iter().map(|a| a.to_string()).collect(),
                connection: r.connection.clone(),
            }),
            EntryBody::ApprovalResolved(r) if r.refused.is_none() => {
                let id = r.request_id.to_string();
                approvals.retain(|a| a.request_id != id);
            }
            EntryBody::QuestionRequest(q) => questions.push(QuestionView {
                request_id: q.request_id.to_string(),
                turn: q.turn.to_string(),
                question: q.question.clone(),
            }),
            other => {
                if let Some(EventBody::QuestionResponse { request_id, .. }) =
                    other.as_input().map(|i| &i.event.body)
                {
                    let id = request_id.to_string();
                    questions.retain(|q| q.request_id != id);
                }
            }
        }
    }
    Ok(Json(Pending {
        approvals,
        questions,
    }))
}
