//! One connection to an MCP server (the official Rust SDK, `rmcp`, as the client): its tools,
//! listed once and bounded, and calls, each within the server's timeout. Nothing here starts
//! a process: the host hands over the pipes of a server it started (sandboxed), or a URL.

use std::time::Duration;

use base64::Engine as _;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncWrite};

use super::spec::{ServerSpec, MAX_LISTED_TOOLS, MAX_TOOLS};
use crate::message::ToolSpec;
use crate::tools::ToolDescription;

/// The longest message read from a stdio server (one JSON-RPC line): longer ones are dropped,
/// and the call they answered times out. (An HTTP server's events are bounded by the SDK's
/// own cap, 16 MiB.)
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// The most pages of a tool list read.
const MAX_PAGES: usize = 16;
/// The largest argument schema of one tool (it is sent to the model every round).
const MAX_SCHEMA_BYTES: usize = 16 * 1024;
/// The longest description of a tool the model is shown.
const MAX_DESCRIPTION: usize = 2_000;

/// A connected server.
pub struct Session {
    spec: ServerSpec,
    client: RunningService<RoleClient, ()>,
}

/// A server's tool as the agent sees it.
#[derive(Debug, Clone)]
pub struct McpTool {
    /// As the model sees it: namespaced (`git__git_status`); side-effecting unless the server
    /// marks it read-only.
    pub description: ToolDescription,
}

impl McpTool {
    /// A tool of `server` offered before it could be listed (it needs the user's connection,
    /// which they lack): named by the manifest's allowlist, arguments as the model sees fit,
    /// side-effecting (nothing says otherwise).
    pub fn unlisted(server: &ServerSpec, tool: &str) -> Self {
        McpTool {
            description: ToolDescription {
                spec: ToolSpec {
                    name: server.tool_name(tool),
                    description: format!(
                        "{tool} of the {} service (the user connects it on first use; its arguments are shown once they have)",
                        server.name
                    ),
                    parameters: serde_json::json!({ "type": "object" }),
                },
                side_effects: true,
            },
        }
    }
}

/// What a call returned, read from the protocol's content.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallResult {
    /// The server marked the result an error (`isError`): it still reaches the model.
    pub is_error: bool,
    /// Text parts, in order.
    pub text: Vec<String>,
    /// Images, audio and embedded resources: the host keeps them as files.
    pub files: Vec<FilePart>,
    /// Links the server gave to resources it did not embed.
    pub links: Vec<Value>,
    /// The structured result, when the server gave one.
    pub structured: Option<Value>,
}

/// A file a call returned.
#[derive(Debug, Clone, PartialEq)]
pub struct FilePart {
    pub name: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

impl Session {
    /// Speaks MCP over a server process's stdout (`read`) and stdin (`write`): initialises
    /// within the server's start timeout.
    pub async fn over_pipes<R, W>(spec: &ServerSpec, read: R, write: W) -> Result<Self, String>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(read, write)
            .with_max_line_length(MAX_MESSAGE_BYTES);
        Self::start(spec, ().serve(transport)).await
    }

    /// Speaks MCP to a streamable-HTTP server, with `bearer` as its `Authorization` (the
    /// token alone, no scheme) when there is one.
    /// Connects to a streamable-HTTP server at `url`, reached at the `pinned` addresses only
    /// (those [`crate::outbound::Outbound::resolve`] checked; none: as DNS says), `bearer`
    /// in its `Authorization` header. Redirects are not followed.
    pub async fn over_http(
        spec: &ServerSpec,
        url: &url::Url,
        bearer: Option<String>,
        pinned: &[std::net::SocketAddr],
    ) -> Result<Self, String> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
        if let Some(token) = bearer {
            config = config.auth_header(token);
        }
        // No proxy from the environment: it would resolve the name again, past the check
        // and the pinning (and see a bearer token on a plain-http URL).
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(spec.start_timeout);
        if let (Some(host), false) = (url.host_str(), pinned.is_empty()) {
            builder = builder.resolve_to_addrs(host, pinned);
        }
        let client = builder
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let transport = StreamableHttpClientTransport::with_client(client, config);
        Self::start(spec, ().serve(transport)).await
    }

    async fn start<F, E>(spec: &ServerSpec, serving: F) -> Result<Self, String>
    where
        F: std::future::Future<Output = Result<RunningService<RoleClient, ()>, E>>,
        E: std::fmt::Display,
    {
        let client = match tokio::time::timeout(spec.start_timeout, serving).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(format!("it did not start: {e}")),
            Err(_) => {
                return Err(format!(
                    "it did not answer within {:?} of starting",
                    spec.start_timeout
                ))
            }
        };
        Ok(Session {
            spec: spec.clone(),
            client,
        })
    }

    /// The server's tools the agent may use, namespaced, in the server's order. A server that
    /// lists more than [`MAX_LISTED_TOOLS`], or leaves more than [`MAX_TOOLS`] after the
    /// allowlist, or a tool of a name the model cannot be given, is refused with why.
    pub async fn tools(&self) -> Result<Vec<McpTool>, String> {
        let listed = tokio::time::timeout(self.spec.start_timeout, self.list())
            .await
            .map_err(|_| {
                format!(
                    "it did not list its tools within {:?}",
                    self.spec.start_timeout
                )
            })??;
        let mut out: Vec<McpTool> = Vec::new();
        for tool in listed.iter().filter(|t| self.spec.allows(&t.name)) {
            let name = self.spec.tool_name(&tool.name);
            if out.iter().any(|t| t.description.spec.name == name) {
                return Err(format!(
                    "it lists the tool {:?} twice",
                    truncate(&tool.name, 80)
                ));
            }
            let valid = name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid {
                return Err(format!(
                    "its tool {:?} has a name a model cannot be given",
                    truncate(&tool.name, 80)
                ));
            }
            let read_only = tool
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false);
            let description = tool.description.as_deref().unwrap_or_default();
            let schema = Value::Object((*tool.input_schema).clone());
            if schema.to_string().len() > MAX_SCHEMA_BYTES {
                return Err(format!(
                    "its tool {:?} has an argument schema over {MAX_SCHEMA_BYTES} bytes",
                    truncate(&tool.name, 80)
                ));
            }
            out.push(McpTool {
                description: ToolDescription {
                    spec: ToolSpec {
                        name,
                        description: truncate(description, MAX_DESCRIPTION),
                        parameters: schema,
                    },
                    side_effects: !read_only,
                },
            });
        }
        if out.len() > MAX_TOOLS {
            return Err(format!(
                "it offers {} tools to the agent; at most {MAX_TOOLS} (narrow them with `tools`)",
                out.len()
            ));
        }
        Ok(out)
    }

    /// Every page of the server's tool list, stopping as soon as it lists more than
    /// [`MAX_LISTED_TOOLS`] or takes more than [`MAX_PAGES`] pages (each page is one message,
    /// at most [`MAX_MESSAGE_BYTES`]).
    async fn list(&self) -> Result<Vec<rmcp::model::Tool>, String> {
        let mut listed = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = cursor
                .take()
                .map(|c| rmcp::model::PaginatedRequestParams::default().with_cursor(Some(c)));
            let page = self
                .client
                .list_tools(params)
                .await
                .map_err(|e| format!("it could not list its tools: {e}"))?;
            listed.extend(page.tools);
            if listed.len() > MAX_LISTED_TOOLS {
                return Err(format!(
                    "it lists more than {MAX_LISTED_TOOLS} tools ({} so far)",
                    listed.len()
                ));
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(listed),
            }
        }
        Err(format!(
            "it lists its tools over more than {MAX_PAGES} pages"
        ))
    }

    /// Calls the server's tool `tool` (its own name) within the call timeout; `meta` goes with
    /// the request as its `_meta` (the idempotency key). An `Err` is why no result came.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Value,
        meta: Map<String, Value>,
    ) -> Result<CallResult, String> {
        let arguments = match arguments {
            Value::Object(map) => Some(map),
            Value::Null => None,
            _ => return Err("the arguments must be a JSON object".into()),
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        params.meta = serde_json::from_value(Value::Object(meta)).ok();
        let timeout: Duration = self.spec.call_timeout;
        let result = tokio::time::timeout(timeout, self.client.call_tool(params))
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
            .map_err(|e| format!("the call failed: {e}"))?;
        let value = serde_json::to_value(&result).map_err(|e| e.to_string())?;
        Ok(CallResult::read(&value))
    }

    /// Ends the session (the host ends the process).
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }
}

impl CallResult {
    /// Reads a `tools/call` result as the protocol writes it.
    fn read(value: &Value) -> CallResult {
        let mut out = CallResult {
            is_error: value["isError"].as_bool().unwrap_or(false),
            structured: value.get("structuredContent").cloned(),
            ..CallResult::default()
        };
        let content = value["content"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (i, part) in content.iter().enumerate() {
            let media = |v: &Value| {
                v["mimeType"]
                    .as_str()
                    .unwrap_or("application/octet-stream")
                    .to_owned()
            };
            match part["type"].as_str() {
                Some("text") => out
                    .text
                    .push(part["text"].as_str().unwrap_or("").to_owned()),
                Some(kind @ ("image" | "audio")) => {
                    let media_type = media(part);
                    match decode(&part["data"]) {
                        Some(bytes) => out.files.push(FilePart {
                            name: format!("{kind}-{}.{}", i + 1, extension(&media_type)),
                            media_type,
                            bytes,
                        }),
                        None => out
                            .text
                            .push(format!("[{kind} {} with undecodable data]", i + 1)),
                    }
                }
                Some("resource") => {
                    let r = &part["resource"];
                    let media_type = r["mimeType"].as_str().unwrap_or("text/plain").to_owned();
                    let bytes = match (r["text"].as_str(), decode(&r["blob"])) {
                        (Some(text), _) => Some(text.as_bytes().to_vec()),
                        (None, blob) => blob,
                    };
                    if let Some(bytes) = bytes {
                        let name = r["uri"]
                            .as_str()
                            .and_then(|u| u.rsplit('/').next())
                            .filter(|n| !n.is_empty())
                            .map(str::to_owned)
                            .unwrap_or_else(|| format!("resource-{}", i + 1));
                        out.files.push(FilePart {
                            name,
                            media_type,
                            bytes,
                        });
                    }
                }
                _ => out.links.push(part.clone()),
            }
        }
        out
    }
}

fn decode(data: &Value) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(data.as_str()?)
        .ok()
}

fn extension(media_type: &str) -> &str {
    match media_type {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "audio/wav" | "audio/x-wav" => "wav",
        "audio/mpeg" => "mp3",
        _ => "bin",
    }
}

fn truncate(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_reads_text_files_links_and_the_error_flag() {
        let r = CallResult::read(&json!({
            "isError": true,
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image", "data": "aGk=", "mimeType": "image/png"},
                {"type": "image", "data": "not base64!", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a/notes.txt", "text": "n"}},
                {"type": "resource_link", "uri": "https://x/y", "name": "y"},
            ],
            "structuredContent": {"k": 1},
        }));
        assert!(r.is_error);
        assert_eq!(
            r.text,
            vec!["one".to_string(), "[image 3 with undecodable data]".into()]
        );
        assert_eq!(r.files[0].name, "image-2.png");
        assert_eq!(r.files[0].bytes, b"hi");
        assert_eq!(r.files[1].name, "notes.txt");
        assert_eq!(r.links.len(), 1);
        assert_eq!(r.structured, Some(json!({"k": 1})));
        let empty = CallResult::read(&json!({}));
        assert!(!empty.is_error && empty.text.is_empty());
    }
}
