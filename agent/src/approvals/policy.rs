//! Which calls are gated: an agent's approval policy (`approval = [{ tool = "publish" }, …]`).

use serde::Deserialize;
use serde_json::Value;

/// One rule of an agent's approval policy (manifest: `approval = [{ tool = "publish" }, …]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    pub tool: String,
    /// `always` (default) or `never`.
    #[serde(default = "always")]
    pub when: String,
    /// With `matches`: gate only calls whose string argument `arg` matches the pattern.
    #[serde(default)]
    pub arg: Option<String>,
    /// A pattern with `*` wildcards, e.g. `deploy/*`.
    #[serde(default)]
    pub matches: Option<String>,
}

fn always() -> String {
    "always".into()
}

/// Which tool calls need a person's approval.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    gates: Vec<Gate>,
}

impl Policy {
    /// Checks the rules; the error names what is wrong.
    pub fn new(gates: Vec<Gate>) -> Result<Self, String> {
        for (i, g) in gates.iter().enumerate() {
            if g.when != "always" && g.when != "never" {
                return Err(format!(
                    "approval[{i}].when: {:?} is not \"always\" or \"never\"",
                    g.when
                ));
            }
            if g.arg.is_some() != g.matches.is_some() {
                return Err(format!("approval[{i}]: `arg` and `matches` go together"));
            }
        }
        Ok(Self { gates })
    }

    /// The tools the rules name.
    pub fn tools(&self) -> Vec<String> {
        self.gates.iter().map(|g| g.tool.clone()).collect()
    }

    /// Whether a call needs approval: the first rule for its tool decides.
    pub fn gated(&self, tool: &str, arguments: &Value) -> bool {
        for gate in self.gates.iter().filter(|g| g.tool == tool) {
            if gate.when == "never" {
                return false;
            }
            match (&gate.arg, &gate.matches) {
                (Some(arg), Some(pattern)) => {
                    // Match what the tool will act on, not how the model spelled it: the
                    // argument as given and as the path it names once decoded and
                    // normalised (`d%65ploy/x`, `./deploy/x`, `a/../deploy/x` are all
                    // `deploy/x`). Any spelling that matches gates the call.
                    if arguments
                        .get(arg)
                        .and_then(Value::as_str)
                        .is_some_and(|v| spellings(v).iter().any(|s| glob(pattern, s)))
                    {
                        return true;
                    }
                }
                _ => return true,
            }
        }
        false
    }
}

/// The spellings of an argument a gate is matched against: as given, and — read as a path
/// the way the file tools read it — percent-decoded, with `.` segments dropped and `..`
/// segments applied (lexically), and empty segments ignored.
fn spellings(value: &str) -> Vec<String> {
    let mut out = vec![value.to_owned()];
    let mut segments: Vec<String> = Vec::new();
    for raw in value.split('/') {
        let decoded = percent_decoded(raw);
        // An encoded `/` inside a segment separates segments once decoded.
        for segment in decoded.split('/') {
            match segment {
                "" | "." => {}
                ".." => {
                    segments.pop();
                }
                other => segments.push(other.to_owned()),
            }
        }
    }
    let normalised = segments.join("/");
    if normalised != value {
        out.push(normalised);
    }
    out
}

/// `%XX` sequences decoded (lossily, as UTF-8); anything else kept as it is.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `*` matches any run of characters; everything else matches itself.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}
