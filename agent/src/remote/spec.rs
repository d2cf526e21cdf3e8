//! An agent's `remote` table: how to reach its app, checked when the manifest loads.

use std::time::Duration;

use serde::Deserialize;

/// How to reach an agent's remote app.
#[derive(Debug, Clone)]
pub struct RemoteSpec {
    pub url: String,
    /// The agent's HTTP client: its connections are pooled across turns.
    pub client: reqwest::Client,
    /// The environment variable holding the bearer secret sent to the app.
    pub secret_env: Option<String>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub deadline: Duration,
    pub max_actions: u32,
    pub max_bytes: u64,
    pub max_line_bytes: u64,
}

/// A manifest's `remote` table, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRemote {
    url: String,
    #[serde(default)]
    secret_env: Option<String>,
    #[serde(default)]
    connect_timeout_ms: Option<u64>,
    #[serde(default)]
    read_timeout_ms: Option<u64>,
    #[serde(default)]
    deadline_secs: Option<u64>,
    #[serde(default)]
    max_actions: Option<u32>,
    #[serde(default)]
    max_bytes: Option<u64>,
    #[serde(default)]
    max_line_bytes: Option<u64>,
}

impl RawRemote {
    /// Checks the table; the error names the field (relative to the table) and the reason.
    pub fn validate(self) -> std::result::Result<RemoteSpec, String> {
        let url = url::Url::parse(&self.url)
            .map_err(|e| format!("url: {:?} is not a URL: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(format!("url: {:?} is not an http(s) URL", self.url));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "url: {:?} must not have a query or fragment",
                self.url
            ));
        }
        if let Some(var) = &self.secret_env {
            let valid =
                !var.is_empty() && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("secret_env: {var:?} is not a variable name"));
            }
        }
        let positive = |field: &str, v: Option<u64>, default: u64| match v {
            Some(0) => Err(format!("{field}: must be more than 0")),
            Some(v) => Ok(v),
            None => Ok(default),
        };
        let max_bytes = positive("max_bytes", self.max_bytes, 4 << 20)?;
        let max_line_bytes = positive("max_line_bytes", self.max_line_bytes, 1 << 20)?;
        if max_line_bytes > max_bytes {
            return Err(format!(
                "max_line_bytes: {max_line_bytes} is more than max_bytes ({max_bytes})"
            ));
        }
        let connect_timeout = Duration::from_millis(positive(
            "connect_timeout_ms",
            self.connect_timeout_ms,
            5_000,
        )?);
        // Redirects are not followed: the context (history, identity) goes to the URL the
        // manifest names and nowhere else.
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("url: cannot build an HTTP client: {e}"))?;
        Ok(RemoteSpec {
            url: self.url,
            client,
            secret_env: self.secret_env,
            connect_timeout,
            read_timeout: Duration::from_millis(positive(
                "read_timeout_ms",
                self.read_timeout_ms,
                30_000,
            )?),
            deadline: Duration::from_secs(positive("deadline_secs", self.deadline_secs, 600)?),
            max_actions: positive("max_actions", self.max_actions.map(u64::from), 1_000)? as u32,
            max_bytes,
            max_line_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> std::result::Result<RemoteSpec, String> {
        toml::from_str::<RawRemote>(text)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn remote_tables_are_checked() {
        let spec = parse("url = \"http://127.0.0.1:9000/app\"\nsecret_env = \"S\"\n").unwrap();
        assert_eq!(spec.read_timeout, Duration::from_secs(30));
        assert_eq!(spec.max_actions, 1_000);
        for (text, expected) in [
            ("url = \"nope\"", "url: \"nope\" is not a URL"),
            ("url = \"ftp://h/\"", "not an http(s) URL"),
            ("url = \"http://h/?a=1\"", "query"),
            ("url = \"http://h/\"\nsecret_env = \"A B\"", "secret_env"),
            (
                "url = \"http://h/\"\nread_timeout_ms = 0",
                "read_timeout_ms: must be more than 0",
            ),
            (
                "url = \"http://h/\"\nmax_bytes = 10\nmax_line_bytes = 20",
                "max_line_bytes",
            ),
            ("url = \"http://h/\"\ncolour = 1", "unknown field"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(expected), "{text}: {e}");
        }
    }
}
