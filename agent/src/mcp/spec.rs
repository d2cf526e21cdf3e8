//! An MCP server as an agent's manifest names it (`[[agents.X.mcp]]`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// How long a server may take to start and list its tools, unless the manifest says.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one call may take, unless the manifest says.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most tools one server may list: a server that lists more fails to start (an allowlist
/// narrows what the model sees, not what the server may list).
pub const MAX_LISTED_TOOLS: usize = 256;
/// The most tools of one server the model sees.
pub const MAX_TOOLS: usize = 64;
/// The separator between a server's name and its tool's in the names the model sees:
/// `git__git_status`. Chat-completion APIs allow only `[A-Za-z0-9_-]` in a function's name,
/// so the dot of `git.git_status` cannot be used.
pub const SEPARATOR: &str = "__";

/// One MCP server of an agent, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    /// The namespace of its tools (`[a-z0-9-]`, 1–32 characters, not `system`).
    pub name: String,
    pub transport: Transport,
    /// The server's tools the agent may use, by the server's own names (none: all it lists,
    /// up to [`MAX_TOOLS`]).
    pub tools: Option<Vec<String>>,
    pub start_timeout: Duration,
    pub call_timeout: Duration,
    /// A url server that needs each user's own credential (their *connection*, stored through
    /// `/v1/connections`): calls carry the turn's sender's, never anyone else's, and a sender
    /// without one parks the call with a `connection_required` card. Such a server names its
    /// `tools`: they are offered to the model before anyone has connected.
    pub connection: bool,
}

/// Where a server runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A local process speaking MCP on stdin/stdout, started sandboxed like a cell for each
    /// turn that uses it: the turn's workspace at `/work` as its only writable path, the host's
    /// `/usr` and `read_only` paths readable, and the network only where `network` says.
    Stdio {
        command: Vec<String>,
        read_only: Vec<PathBuf>,
        network: bool,
    },
    /// A streamable-HTTP server, called from the worker.
    Http { url: url::Url },
}

impl ServerSpec {
    /// The name the model sees for the server's tool `tool`.
    pub fn tool_name(&self, tool: &str) -> String {
        format!("{}{SEPARATOR}{tool}", self.name)
    }

    /// The server's own name of a tool the model knows as `name`, if it is this server's.
    pub fn own_name<'n>(&self, name: &'n str) -> Option<&'n str> {
        name.strip_prefix(self.name.as_str())?
            .strip_prefix(SEPARATOR)
    }

    /// Whether the allowlist lets the agent use the server's tool `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n == tool))
    }
}

/// `[[agents.X.mcp]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    name: String,
    #[serde(default)]
    command: Option<Vec<String>>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    read_only: Vec<PathBuf>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    connection: bool,
    #[serde(default)]
    start_timeout_secs: Option<u64>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

impl RawServer {
    /// A local server as a manifest would name it (defaults elsewhere).
    pub fn stdio(name: &str, command: Vec<String>, read_only: Vec<PathBuf>) -> Self {
        RawServer {
            name: name.to_owned(),
            command: Some(command),
            url: None,
            tools: None,
            read_only,
            network: false,
            connection: false,
            start_timeout_secs: None,
            timeout_secs: None,
        }
    }

    /// Validates one server; the error names the field.
    pub fn validate(self) -> Result<ServerSpec, String> {
        let name = self.name;
        let well_formed = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && name != "system";
        if !well_formed {
            return Err(format!(
                "name: {name:?} must be 1–32 of a-z, 0-9 and '-', and not \"system\""
            ));
        }
        let transport = match (self.command, self.url) {
            (Some(command), None) => {
                match command.first() {
                    Some(program) if program.starts_with('/') => {}
                    _ => {
                        return Err(format!(
                            "command: the first word must be the program's absolute path, not {:?}",
                            command.first().map(String::as_str).unwrap_or("")
                        ))
                    }
                }
                if self.connection {
                    return Err("connection: only a url server takes a user's connection".into());
                }
                if self.network {
                    return Err("network: a local server has no network yet (its own network namespace with a filtered way out is to come); use a url server".into());
                }
                for p in &self.read_only {
                    let dotted = p.components().any(|c| {
                        matches!(
                            c,
                            std::path::Component::ParentDir | std::path::Component::CurDir
                        )
                    });
                    let reserved = dotted
                        || ["/", "/work", "/proc", "/dev", "/sys", "/tmp"]
                            .iter()
                            .any(|r| {
                                p == std::path::Path::new(r) || (*r != "/" && p.starts_with(r))
                            });
                    if !p.is_absolute() || reserved {
                        return Err(format!(
                            "read_only: {} must be an absolute path without `..`, not / or under /work, /proc, /dev, /sys or /tmp (the sandbox's own)",
                            p.display()
                        ));
                    }
                }
                Transport::Stdio {
                    command,
                    read_only: self.read_only,
                    network: self.network,
                }
            }
            (None, Some(url)) => {
                let parsed =
                    url::Url::parse(&url).map_err(|e| format!("url: {url:?} is not a URL: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("url: {url:?} is not http or https"));
                }
                if !self.read_only.is_empty() || self.network {
                    return Err(
                        "read_only and network are for a local (command) server, not a url".into(),
                    );
                }
                if self.connection && self.tools.as_ref().is_none_or(Vec::is_empty) {
                    return Err("tools: a server that needs a connection names the tools the agent may use (they are offered before the user has connected)".into());
                }
                Transport::Http { url: parsed }
            }
            _ => return Err("needs either command (a local server) or url, not both".into()),
        };
        let secs = |s: Option<u64>, default: Duration| {
            s.map_or(default, |s| Duration::from_secs(s.clamp(1, 600)))
        };
        Ok(ServerSpec {
            name,
            transport,
            tools: self.tools,
            start_timeout: secs(self.start_timeout_secs, DEFAULT_START_TIMEOUT),
            call_timeout: secs(self.timeout_secs, DEFAULT_CALL_TIMEOUT),
            connection: self.connection,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Result<ServerSpec, String> {
        toml::from_str::<RawServer>(text)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn a_server_is_a_command_or_a_url_and_its_tools_are_namespaced() {
        let s = raw(r#"name = "git"
command = ["/usr/bin/mcp-server-git", "--repository", "/work"]
tools = ["git_status"]"#)
        .unwrap();
        assert_eq!(s.tool_name("git_status"), "git__git_status");
        assert_eq!(s.own_name("git__git_status"), Some("git_status"));
        assert_eq!(s.own_name("gitx__git_status"), None);
        assert_eq!(s.own_name("git_status"), None);
        assert!(s.allows("git_status") && !s.allows("git_commit"));
        assert_eq!(s.call_timeout, DEFAULT_CALL_TIMEOUT);
        let h =
            raw("name = \"tickets\"\nurl = \"http://127.0.0.1:9/mcp\"\ntimeout_secs = 5").unwrap();
        assert!(matches!(h.transport, Transport::Http { .. }));
        assert_eq!(h.call_timeout, Duration::from_secs(5));
        assert!(h.allows("anything"));
    }

    #[test]
    fn bad_servers_are_refused_with_the_field() {
        for (text, field) in [
            ("name = \"Git\"\ncommand = [\"/x\"]", "name"),
            ("name = \"system\"\ncommand = [\"/x\"]", "name"),
            ("name = \"a__b\"\ncommand = [\"/x\"]", "name"),
            ("name = \"git\"\ncommand = [\"git\"]", "command"),
            ("name = \"git\"\ncommand = []", "command"),
            ("name = \"git\"", "either"),
            (
                "name = \"git\"\ncommand = [\"/x\"]\nurl = \"http://a/\"",
                "either",
            ),
            ("name = \"git\"\nurl = \"file:///etc/passwd\"", "url"),
            (
                "name = \"git\"\nurl = \"http://a/\"\nnetwork = true",
                "read_only",
            ),
            (
                "name = \"git\"\ncommand = [\"/x\"]\nread_only = [\"rel\"]",
                "read_only",
            ),
            (
                "name = \"git\"\ncommand = [\"/x\"]\nread_only = [\"/work/main\"]",
                "read_only",
            ),
            (
                "name = \"git\"\ncommand = [\"/x\"]\nread_only = [\"/\"]",
                "read_only",
            ),
            (
                "name = \"git\"\ncommand = [\"/x\"]\nconnection = true",
                "connection",
            ),
            (
                "name = \"tickets\"\nurl = \"http://a/\"\nconnection = true",
                "tools",
            ),
        ] {
            let e = raw(text).unwrap_err();
            assert!(e.contains(field), "{text}: {e}");
        }
    }
}
