//! Identities: who acts.
//!
//! The textual form is `provider:external_id` or `provider:scope:external_id`
//! (`github:octocat`, `oidc:acme:u-17`). The runtime binds an identity to a turn from the
//! authenticated caller; this module only parses and prints them.

use std::fmt;
use std::str::FromStr;

use crate::error::{truncate, SchemaError, SchemaErrorKind};
use crate::ids::string_serde;

/// The longest identity accepted, in bytes.
pub const MAX_IDENTITY_LEN: usize = 256;

/// Who acts: a provider, an optional scope, and the provider's id for the subject.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    provider: String,
    scope: Option<String>,
    external_id: String,
}

impl Identity {
    /// Builds an identity from its parts, validating each.
    pub fn new(
        provider: &str,
        scope: Option<&str>,
        external_id: &str,
    ) -> Result<Self, SchemaError> {
        let text = match scope {
            Some(scope) => format!("{provider}:{scope}:{external_id}"),
            None => format!("{provider}:{external_id}"),
        };
        text.parse()
    }

    /// The identity provider (`oidc`, `github`, `token`, …).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The provider's scope (an issuer or organisation), when there is one.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// The provider's id for the subject.
    pub fn external_id(&self) -> &str {
        &self.external_id
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            Some(scope) => write!(f, "{}:{}:{}", self.provider, scope, self.external_id),
            None => write!(f, "{}:{}", self.provider, self.external_id),
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Identity {
    type Err = SchemaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |why: &str| {
            SchemaError::new(
                SchemaErrorKind::InvalidIdentity,
                format!(
                    "invalid identity {:?}: {why} (expected `provider:external_id` or `provider:scope:external_id`, e.g. `oidc:acme:u-17`)",
                    truncate(s)
                ),
            )
        };
        if s.len() > MAX_IDENTITY_LEN {
            return Err(fail("longer than 256 bytes"));
        }
        let parts: Vec<&str> = s.split(':').collect();
        let (provider, scope, external_id) = match parts.as_slice() {
            [provider, external_id] => (*provider, None, *external_id),
            [provider, scope, external_id] => (*provider, Some(*scope), *external_id),
            [_] => return Err(fail("missing `:`")),
            _ => return Err(fail("too many `:` separators")),
        };
        let provider_ok = !provider.is_empty()
            && provider.len() <= 32
            && provider.starts_with(|c: char| c.is_ascii_lowercase())
            && provider
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !provider_ok {
            return Err(fail(
                "the provider must be 1–32 lowercase letters, digits, `-` or `_`, starting with a letter",
            ));
        }
        for (name, part) in [("scope", scope), ("external id", Some(external_id))] {
            let Some(part) = part else { continue };
            if part.is_empty() {
                return Err(fail(&format!("the {name} is empty")));
            }
            if part.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(fail(&format!(
                    "the {name} contains whitespace or control characters"
                )));
            }
        }
        Ok(Identity {
            provider: provider.to_owned(),
            scope: scope.map(str::to_owned),
            external_id: external_id.to_owned(),
        })
    }
}

string_serde!(Identity);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_both_forms() {
        let scoped: Identity = "oidc:acme:u-17".parse().unwrap();
        assert_eq!(scoped.provider(), "oidc");
        assert_eq!(scoped.scope(), Some("acme"));
        assert_eq!(scoped.external_id(), "u-17");
        let plain: Identity = "github:octocat".parse().unwrap();
        assert_eq!(plain.scope(), None);
        assert_eq!(plain.to_string(), "github:octocat");
        assert_eq!(Identity::new("oidc", Some("acme"), "u-17").unwrap(), scoped);
    }

    #[test]
    fn rejects_malformed_with_a_clear_message() {
        let cases = [
            ("octocat", "missing `:`"),
            ("a:b:c:d", "too many"),
            (":octocat", "provider"),
            ("GitHub:octocat", "provider"),
            ("github:", "external id is empty"),
            ("oidc::u-17", "scope is empty"),
            ("oidc:acme:u 17", "whitespace"),
            ("oidc:acme:u\u{0}17", "control"),
        ];
        for (input, expected) in cases {
            let err = input.parse::<Identity>().unwrap_err();
            assert_eq!(err.kind(), &SchemaErrorKind::InvalidIdentity);
            assert!(err.to_string().contains(expected), "{input}: {err}");
        }
        assert!("a:".repeat(200).parse::<Identity>().is_err());
    }

    proptest! {
        #[test]
        fn round_trips(provider in "[a-z][a-z0-9_-]{0,31}", scope in proptest::option::of("[^:\\s\\p{Cc}]{1,20}"), ext in "[^:\\s\\p{Cc}]{1,40}") {
            let id = Identity::new(&provider, scope.as_deref(), &ext).unwrap();
            prop_assert_eq!(id.to_string().parse::<Identity>().unwrap(), id.clone());
            let json = serde_json::to_string(&id).unwrap();
            prop_assert_eq!(serde_json::from_str::<Identity>(&json).unwrap(), id);
        }
    }
}
