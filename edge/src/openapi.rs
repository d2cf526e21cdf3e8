//! The OpenAPI document, generated from the handlers' annotations and served at
//! `/v1/openapi.json`. Every authenticated operation also documents the errors any request
//! can meet (bad input, no token, limits, saturation), in the one error shape.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::model;
use super::{
    a2a, connections, conversations, error, events, files, hooks, mcp, memory, schedules, services,
    stream, tickets, usage, versions, webhooks,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Turnpike", description = "Hosts many apps' AI agents for many users: conversations, events in, rows and live frames out."),
    paths(
        conversations::list_apps,
        conversations::create,
        conversations::list,
        conversations::get_one,
        conversations::close,
        conversations::export,
        conversations::delete,
        conversations::delete_me,
        conversations::grant,
        conversations::revoke,
        events::message,
        events::list_rows,
        events::follow_up,
        events::steer,
        events::stop,
        events::pending,
        events::approve,
        events::reject,
        events::answer,
        events::switch_agent,
        events::compact,
        files::upload,
        files::download,
        files::link,
        files::follow_link,
        stream::websocket,
        stream::sse,
        tickets::create,
        services::search,
        memory::list,
        memory::forget_row,
        memory::forget_conversation,
        services::phases,
        services::verify,
        services::replay,
        usage::conversation,
        usage::tenant,
        versions::list_versions,
        versions::version_files,
        versions::version_diff,
        conversations::me,
        connections::list,
        connections::get_one,
        connections::put,
        connections::delete,
        schedules::create,
        schedules::list,
        schedules::get_one,
        schedules::pause,
        schedules::resume,
        schedules::delete,
        webhooks::create,
        webhooks::list,
        webhooks::delete,
        webhooks::dead_letters,
        webhooks::redeliver,
        hooks::receive,
        a2a::agent_cards,
        a2a::agent_card,
        a2a::rpc,
        mcp::endpoint,
    ),
    components(schemas(error::ErrorBody, model::Frame)),
    modifiers(&Common),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

struct Common;

impl Modify for Common {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        let common = [
            ("400", "malformed request"),
            ("401", "missing or invalid bearer token"),
            ("404", "no such resource for this identity"),
            ("405", "method not allowed"),
            ("409", "the conversation is closed"),
            ("413", "body too large"),
            ("415", "unsupported media type"),
            ("422", "invalid request"),
            (
                "429",
                "rate limited, or a daily budget is spent (see Retry-After)",
            ),
            ("503", "unavailable or saturated (see Retry-After)"),
        ];
        // Links from a created conversation to every operation on it, so clients (and fuzzers)
        // can follow them.
        let mut links = Vec::new();
        for (path, item) in &openapi.paths.paths {
            if !path.starts_with("/v1/conversations/{id}") || path.matches('{').count() != 1 {
                continue;
            }
            let ops = [&item.get, &item.post, &item.delete];
            for op in ops.into_iter().flatten() {
                if let Some(id) = &op.operation_id {
                    links.push(id.clone());
                }
            }
        }
        if let Some(create) = openapi
            .paths
            .paths
            .get_mut("/v1/conversations")
            .and_then(|item| item.post.as_mut())
        {
            if let Some(RefOr::T(created)) = create.responses.responses.get_mut("201") {
                for id in links {
                    created.links.insert(
                        id.clone(),
                        RefOr::T(
                            utoipa::openapi::link::LinkBuilder::new()
                                .operation_id(id)
                                .parameter("id", "$response.body#/id")
                                .build(),
                        ),
                    );
                }
            }
        }
        for item in openapi.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in ops.into_iter().flatten() {
                for (code, what) in common {
                    op.responses
                        .responses
                        .entry(code.to_owned())
                        .or_insert_with(|| {
                            RefOr::T(
                                ResponseBuilder::new()
                                    .description(what)
                                    .content(
                                        "application/json",
                                        utoipa::openapi::ContentBuilder::new()
                                            .schema(Some(RefOr::Ref(
                                                utoipa::openapi::Ref::from_schema_name("ErrorBody"),
                                            )))
                                            .build(),
                                    )
                                    .build(),
                            )
                        });
                }
            }
        }
    }
}

/// The values of `v` if it is an object (nothing otherwise).
fn objects(v: Option<&mut serde_json::Value>) -> impl Iterator<Item = &mut serde_json::Value> {
    v.and_then(|v| v.as_object_mut())
        .into_iter()
        .flat_map(|o| o.values_mut())
}

/// The grammar of a conversation id, as a pattern.
const CONVERSATION_ID: &str = "^conv_[0-7][0-9A-HJKMNP-TV-Z]{25}$";
/// The grammar of an idempotency key: 1–128 printable ASCII characters.
const IDEMPOTENCY_KEY: &str = "^[!-~]{1,128}$";

/// Constraints the handlers' annotations cannot state in one place: every conversation `{id}`
/// and every `Idempotency-Key` has its grammar, and an upload is a form with exactly one file.
fn tighten(doc: &mut serde_json::Value) {
    for (path, item) in doc
        .get_mut("paths")
        .and_then(|p| p.as_object_mut())
        .into_iter()
        .flat_map(|p| p.iter_mut())
    {
        let conversations = path.starts_with("/v1/conversations/{id}")
            || path.starts_with("/v1/admin/conversations/{id}");
        for op in item
            .as_object_mut()
            .into_iter()
            .flat_map(|i| i.values_mut())
        {
            for param in op
                .get_mut("parameters")
                .and_then(|p| p.as_array_mut())
                .into_iter()
                .flat_map(|p| p.iter_mut())
            {
                let pattern = match (param["name"].as_str(), param["in"].as_str()) {
                    (Some("id"), Some("path")) if conversations => CONVERSATION_ID,
                    (Some("Idempotency-Key"), Some("header")) => IDEMPOTENCY_KEY,
                    _ => continue,
                };
                param["schema"]["pattern"] = pattern.into();
            }
            if let Some(form) = op
                .pointer_mut("/requestBody/content/multipart~1form-data")
                .and_then(|c| c.as_object_mut())
            {
                form.insert(
                    "schema".into(),
                    serde_json::json!({
                        "type": "object",
                        "required": ["file"],
                        "properties": {
                            "file": { "type": "string", "format": "binary", "minLength": 1 }
                        },
                        "additionalProperties": false,
                    }),
                );
            }
            if let Some(body) = op.get_mut("requestBody").and_then(|b| b.as_object_mut()) {
                body.insert("required".into(), true.into());
            }
        }
    }
}

/// The document, as served.
pub fn document_value() -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    tighten(&mut doc);
    // utoipa 5 writes a link's fields in snake case; the specification spells them in camel case.
    for item in objects(doc.get_mut("paths")) {
        for op in item
            .as_object_mut()
            .into_iter()
            .flat_map(|i| i.values_mut())
        {
            for response in objects(op.get_mut("responses")) {
                for link in objects(response.get_mut("links")) {
                    if let Some(link) = link.as_object_mut() {
                        for (from, to) in [
                            ("operation_id", "operationId"),
                            ("operation_ref", "operationRef"),
                            ("request_body", "requestBody"),
                        ] {
                            if let Some(v) = link.remove(from) {
                                link.insert(to.to_owned(), v);
                            }
                        }
                    }
                }
            }
        }
    }
    doc
}

/// `GET /v1/openapi.json`.
pub async fn document() -> Json<serde_json::Value> {
    Json(document_value())
}
