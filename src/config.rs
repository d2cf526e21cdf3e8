//! The configuration file (DESIGN, "Operating it"): defaults → a TOML file (`--config FILE`
//! or `TURNPIKE_CONFIG`) → `TURNPIKE_…` environment variables → flags.
//!
//! The file's keys are the flags' long names (`slots = 8`, `nats-url = "nats://…"`,
//! `admin = ["oidc:acme:ops"]`; `_` and `-` alike). A value from the file counts only where
//! neither the environment nor the command line set one. A key that no command has, a value of
//! the wrong shape, or a value its flag refuses stops the process at start, naming the file,
//! the key and the reason. A key of another command (a `slots` read by `router`) is left to
//! that command, so one file can serve a whole deployment. `turnpike config show` prints what
//! applies and where each value came from, secrets redacted.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory as _, FromArgMatches as _};

use crate::cli::Cli;

/// The command line with the file's values added where neither a flag nor the environment set
/// one, and the keys the file supplied; `argv` unchanged when there is no file.
pub fn apply(argv: Vec<OsString>) -> Result<(Vec<OsString>, BTreeSet<String>), String> {
    let Some(path) = config_path(&argv) else {
        return Ok((argv, BTreeSet::new()));
    };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("config file {shown}: cannot read it: {e}"))?;
    // The parser's message, and where: never the offending line, which may hold a secret.
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
        match line {
            Some(line) => format!("config file {shown}: line {line}: {}", e.message()),
            None => format!("config file {shown}: {}", e.message()),
        }
    })?;
    // What the command line and the environment say, and which command runs. A command line
    // that does not parse is left for the real parse to report.
    let Ok(matches) = Cli::command().try_get_matches_from(&argv) else {
        return Ok((argv, BTreeSet::new()));
    };
    let (names, deepest) = command_path(&matches);
    let mut command = built();
    for name in &names {
        command = command
            .find_subcommand(name)
            .cloned()
            .expect("a parsed subcommand exists");
    }
    let known = every_long_name();
    let mut extra = Vec::new();
    let mut supplied = BTreeSet::new();
    for (raw_key, value) in &table {
        let key = raw_key.replace('_', "-");
        if !known.contains(&key) {
            return Err(format!(
                "config file {shown}: {raw_key}: not a setting of turnpike (the keys are the flags' long names; see `turnpike serve --help`)"
            ));
        }
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
        else {
            continue; // another command's setting
        };
        let id = arg.get_id().as_str();
        if matches!(
            deepest.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let values =
            values_of(value).map_err(|why| format!("config file {shown}: {raw_key}: {why}"))?;
        let takes_value = arg.get_action().takes_values();
        let mut args = Vec::new();
        for v in values {
            match (takes_value, v.as_str()) {
                (true, _) => args.push(OsString::from(format!("--{key}={v}"))),
                (false, "true") => args.push(OsString::from(format!("--{key}"))),
                (false, "false") => {}
                (false, other) => {
                    return Err(format!(
                    "config file {shown}: {raw_key}: a switch takes true or false, not {other:?}"
                ))
                }
            }
        }
        // Each value is checked on its own, so that a refusal names its key.
        let mut trial = argv.clone();
        trial.extend(args.iter().cloned());
        if let Err(e) = Cli::command().try_get_matches_from(&trial) {
            let why = e.to_string();
            let why = why
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ");
            return Err(format!("config file {shown}: {raw_key}: {why}"));
        }
        if !args.is_empty() {
            supplied.insert(key);
        }
        extra.extend(args);
    }
    let mut out = argv;
    out.extend(extra);
    Ok((out, supplied))
}

/// The command line's definition with the global flags propagated to every subcommand.
fn built() -> clap::Command {
    let mut command = Cli::command();
    command.build();
    command
}

/// `--config FILE`, `--config=FILE`, or `TURNPIKE_CONFIG`.
fn config_path(argv: &[OsString]) -> Option<PathBuf> {
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("TURNPIKE_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The subcommand names down to the deepest, and its matches.
fn command_path(matches: &ArgMatches) -> (Vec<String>, &ArgMatches) {
    let mut names = Vec::new();
    let mut deepest = matches;
    while let Some((name, sub)) = deepest.subcommand() {
        names.push(name.to_owned());
        deepest = sub;
    }
    (names, deepest)
}

/// Every flag's long name, in any command.
fn every_long_name() -> BTreeSet<String> {
    fn walk(command: &clap::Command, out: &mut BTreeSet<String>) {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long() {
                out.insert(long.to_owned());
            }
        }
        for sub in command.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&built(), &mut out);
    out.remove("config");
    out.remove("help");
    out.remove("version");
    out
}

/// A TOML value as flag values (an array: one per element).
fn values_of(value: &toml::Value) -> Result<Vec<String>, String> {
    let one = |v: &toml::Value| -> Result<String, String> {
        match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            toml::Value::Boolean(b) => Ok(b.to_string()),
            other => Err(format!("a {} is not a value here", other.type_str())),
        }
    };
    match value {
        toml::Value::Array(items) => items.iter().map(one).collect(),
        other => Ok(vec![one(other)?]),
    }
}

/// One setting as `config show` prints it.
#[derive(Debug, serde::Serialize)]
pub struct Shown {
    pub key: String,
    /// The values (several for a list), secrets redacted; empty when unset.
    pub values: Vec<String>,
    /// `default`, `file`, `env`, `flag`, or `unset`.
    pub source: &'static str,
}

/// What `command` (`serve`, `router`, `worker`) would run with, given this process's
/// environment and the global flags and file of `argv`.
pub fn show(argv: &[OsString], command: &str) -> Result<Vec<Shown>, String> {
    // The same global flags (before or after `config show`), then the command.
    let mut run: Vec<OsString> = vec![argv.first().cloned().unwrap_or_else(|| "turnpike".into())];
    let (mut seen_config, mut seen_show) = (false, false);
    let mut rest = argv.iter().skip(1);
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy();
        match text.as_ref() {
            "config" if !seen_config => seen_config = true,
            "show" if seen_config && !seen_show => seen_show = true,
            "--json" if seen_show => {}
            "--for" if seen_show => {
                rest.next();
            }
            t if seen_show && t.starts_with("--for=") => {}
            _ => run.push(arg.clone()),
        }
    }
    run.push(command.into());
    let (full, from_file) = apply(run)?;
    let matches = Cli::command()
        .try_get_matches_from(&full)
        .map_err(|e| e.to_string())?;
    let (_, deepest) = command_path(&matches);
    let sub = built()
        .find_subcommand(command)
        .cloned()
        .ok_or_else(|| format!("no command {command}"))?;
    let mut out = BTreeMap::new();
    for arg in sub.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version" | "config") {
            continue;
        }
        let id = arg.get_id().as_str();
        let secret = SECRETS.contains(&long);
        let mut values: Vec<String> = deepest
            .get_raw(id)
            .map(|vs| {
                vs.map(|v| match secret {
                    true => "REDACTED".to_owned(),
                    false => redact(&v.to_string_lossy()),
                })
                .collect()
            })
            .unwrap_or_default();
        let mut source = match deepest.value_source(id) {
            Some(ValueSource::CommandLine) if from_file.contains(long) => "file",
            Some(ValueSource::CommandLine) => "flag",
            Some(ValueSource::EnvVariable) => "env",
            Some(ValueSource::DefaultValue) => "default",
            Some(_) => "flag",
            None => "unset",
        };
        // A default that depends on the command, which clap cannot know.
        if source == "unset" && long == "blocking-threads" {
            let cli = Cli::from_arg_matches(&matches).map_err(|e| e.to_string())?;
            values = vec![cli.command.default_blocking_threads().to_string()];
            source = "default";
        }
        out.insert(
            long.to_owned(),
            Shown {
                key: long.to_owned(),
                values,
                source,
            },
        );
    }
    Ok(out.into_values().collect())
}

/// Settings whose values are secrets: never shown.
const SECRETS: &[&str] = &["nats-password", "nats-token"];

/// A value with any credentials in it replaced: in each of its comma-separated URLs the user
/// part (a password, or a token given as the user) and password-like query parameters.
fn redact(value: &str) -> String {
    value
        .split(',')
        .map(|part| match url::Url::parse(part) {
            Ok(mut url) if url.has_host() => {
                if url.password().is_some() {
                    let _ = url.set_password(Some("REDACTED"));
                } else if !url.username().is_empty() && url.scheme().starts_with("nats") {
                    let _ = url.set_username("REDACTED");
                }
                let query: Vec<(String, String)> = url
                    .query_pairs()
                    .map(|(k, v)| {
                        let secret = ["password", "pass", "token", "secret", "key"]
                            .iter()
                            .any(|s| k.to_ascii_lowercase().contains(s));
                        (
                            k.into_owned(),
                            if secret {
                                "REDACTED".into()
                            } else {
                                v.into_owned()
                            },
                        )
                    })
                    .collect();
                if !query.is_empty() {
                    url.query_pairs_mut().clear().extend_pairs(query);
                }
                url.to_string()
            }
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_redacted_and_nothing_else_changes() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/turnpike"),
            "postgres://app:REDACTED@db:5432/turnpike"
        );
        assert_eq!(redact("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redact("64"), "64");
        assert_eq!(
            redact("nats://u:p1@a:4222,nats://s3cr3t-token@b:4222"),
            "nats://u:REDACTED@a:4222,nats://REDACTED@b:4222"
        );
        let db = redact("postgres://db/turnpike?sslmode=require&password=hunter2");
        assert!(
            !db.contains("hunter2") && db.contains("sslmode=require"),
            "{db}"
        );
    }
}
