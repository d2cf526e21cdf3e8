//! Typed identifiers.
//!
//! Two shapes exist:
//! - *minted* ids (`conv_<ulid>`, `evt_<ulid>`, `wkr_<ulid>`): a fixed prefix and a ULID, created by
//!   the runtime;
//! - *named* ids (tenant, app, agent): lowercase slugs chosen by operators in manifests.
//!
//! Every id round-trips through `FromStr`, `Display` and serde (as its string form).

use std::fmt;
use std::str::FromStr;

use ulid::Ulid;

use crate::error::SchemaError;

/// Declares an id made of a fixed prefix and a ULID.
macro_rules! minted_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Ulid);

        impl $name {
            /// The prefix of the textual form, underscore included.
            pub const PREFIX: &'static str = $prefix;

            /// Mints a new, time-ordered id.
            pub fn new() -> Self {
                Self(Ulid::new())
            }

            /// Wraps an existing ULID.
            pub const fn from_ulid(ulid: Ulid) -> Self {
                Self(ulid)
            }

            /// The ULID inside the id.
            pub const fn ulid(&self) -> Ulid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", Self::PREFIX, self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = SchemaError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let rest = s.strip_prefix(Self::PREFIX).ok_or_else(|| {
                    SchemaError::invalid_id($what, s, concat!("expected the prefix `", $prefix, "`"))
                })?;
                // Canonical form only: uppercase Crockford base32, as `Display` writes it.
                if rest.len() != 26 || rest.bytes().any(|b| b.is_ascii_lowercase()) {
                    return Err(SchemaError::invalid_id($what, s, "expected 26 uppercase ULID characters after the prefix"));
                }
                let ulid = Ulid::from_string(rest)
                    .map_err(|_| SchemaError::invalid_id($what, s, "not a valid ULID"))?;
                Ok(Self(ulid))
            }
        }

        string_serde!($name);
    };
}

/// Declares an id that is an operator-chosen slug: `[a-z0-9][a-z0-9_-]{0,62}`.
macro_rules! named_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = SchemaError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                validate_slug(s).map_err(|why| SchemaError::invalid_id($what, s, why))?;
                Ok(Self(s.to_owned()))
            }
        }

        string_serde!($name);
    };
}

/// Implements serde through `Display` / `FromStr`.
macro_rules! string_serde {
    ($name:ident) => {
        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(
                    deserializer,
                )?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use string_serde;

/// The longest slug accepted for a named id.
pub const MAX_SLUG_LEN: usize = 63;

fn validate_slug(s: &str) -> Result<(), &'static str> {
    let bytes = s.as_bytes();
    let Some(first) = bytes.first() else {
        return Err("must not be empty");
    };
    if bytes.len() > MAX_SLUG_LEN {
        return Err("longer than 63 characters");
    }
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Err("must start with a lowercase letter or a digit");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
    {
        return Err("may contain only lowercase letters, digits, `-` and `_`");
    }
    Ok(())
}

minted_id!(
    /// A conversation: `conv_<ulid>`.
    ConversationId, "conv_", "conversation id"
);
minted_id!(
    /// An addressed input event: `evt_<ulid>`.
    EventId, "evt_", "event id"
);
minted_id!(
    /// A worker process: `wkr_<ulid>`.
    WorkerId, "wkr_", "worker id"
);
minted_id!(
    /// An approval or question request: `req_<ulid>`.
    RequestId, "req_", "request id"
);
minted_id!(
    /// A schedule: `sched_<ulid>`.
    ScheduleId, "sched_", "schedule id"
);
named_id!(
    /// A tenant, the isolation boundary above users.
    TenantId, "tenant id"
);
named_id!(
    /// An app: a bundle of agents declared by a manifest.
    AppId, "app id"
);
named_id!(
    /// An agent of an app.
    AgentId, "agent id"
);

/// A turn of one conversation: `turn_<n>`, n = 1, 2, …
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TurnId(u64);

impl TurnId {
    /// The first turn of every conversation.
    pub const FIRST: TurnId = TurnId(1);

    /// `turn_<n>`; `None` for n = 0.
    pub const fn new(n: u64) -> Option<Self> {
        if n == 0 {
            None
        } else {
            Some(Self(n))
        }
    }

    /// The turn's number, starting at 1.
    pub const fn number(&self) -> u64 {
        self.0
    }

    /// The turn after this one.
    pub const fn next(&self) -> TurnId {
        TurnId(self.0 + 1)
    }
}

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "turn_{}", self.0)
    }
}

impl fmt::Debug for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for TurnId {
    type Err = SchemaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s
            .strip_prefix("turn_")
            .ok_or_else(|| SchemaError::invalid_id("turn id", s, "expected `turn_<n>`"))?;
        // Canonical decimal only: no sign, no leading zero, in range of u64.
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && !digits.starts_with('0');
        if !canonical {
            return Err(SchemaError::invalid_id(
                "turn id",
                s,
                "the turn number must be a positive decimal without leading zeros",
            ));
        }
        let n: u64 = digits
            .parse()
            .map_err(|_| SchemaError::invalid_id("turn id", s, "turn number out of range"))?;
        Ok(TurnId(n))
    }
}

string_serde!(TurnId);

/// A fencing epoch: the revision of the lease an owner held when it wrote. It only grows, so of
/// two owners of one conversation the later one has the larger epoch.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {}", self.0)
    }
}

/// A project version: the git commit a turn published, written as 40 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProjectVersion([u8; 20]);

impl ProjectVersion {
    /// The version with this commit id.
    pub fn from_bytes(bytes: [u8; 20]) -> Self {
        Self(bytes)
    }

    /// The commit id's bytes.
    pub fn as_bytes(&self) -> &[u8; 20] {
        &self.0
    }
}

impl fmt::Display for ProjectVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ProjectVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for ProjectVersion {
    type Err = SchemaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail =
            || SchemaError::invalid_id("project version", s, "expected 40 lowercase hex digits");
        if s.len() != 40
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(fail());
        }
        let mut bytes = [0u8; 20];
        for (i, pair) in s.as_bytes().chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).map_err(|_| fail())?;
            bytes[i] = u8::from_str_radix(text, 16).map_err(|_| fail())?;
        }
        Ok(Self(bytes))
    }
}

string_serde!(ProjectVersion);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_version_is_40_lowercase_hex_digits_and_round_trips() {
        let text = "0123456789abcdef0123456789abcdef01234567";
        let v: ProjectVersion = text.parse().unwrap();
        assert_eq!(v.to_string(), text);
        assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{text}\""));
        for bad in [
            "",
            "0123",
            &text.to_uppercase(),
            &format!("{text}0"),
            "g123456789abcdef0123456789abcdef01234567",
        ] {
            assert!(bad.parse::<ProjectVersion>().is_err(), "{bad:?}");
        }
    }
    use proptest::prelude::*;

    #[test]
    fn minted_ids_round_trip_and_reject_other_prefixes() {
        let id = ConversationId::new();
        let text = id.to_string();
        assert!(text.starts_with("conv_"));
        assert_eq!(text.parse::<ConversationId>().unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<ConversationId>(&json).unwrap(), id);

        let as_event = text.replacen("conv_", "evt_", 1);
        assert!(as_event.parse::<ConversationId>().is_err());
        assert!("conv_".parse::<ConversationId>().is_err());
        assert!(text.to_lowercase().parse::<ConversationId>().is_err());
        assert!(format!("{text}0").parse::<ConversationId>().is_err());
    }

    #[test]
    fn named_ids_accept_slugs_only() {
        for ok in ["acme", "a", "support-bot", "app_2", "0x"] {
            assert_eq!(ok.parse::<TenantId>().unwrap().as_str(), ok);
        }
        for bad in ["", "Acme", "-x", "a b", "a/b", "é", &"a".repeat(64)] {
            let err = bad.parse::<AppId>().unwrap_err();
            assert!(err.to_string().contains("app id"), "{err}");
        }
    }

    #[test]
    fn turn_ids_are_canonical() {
        assert_eq!("turn_1".parse::<TurnId>().unwrap(), TurnId::FIRST);
        assert_eq!("turn_42".parse::<TurnId>().unwrap().number(), 42);
        for bad in [
            "turn_0",
            "turn_01",
            "turn_",
            "turn_-1",
            "turn_+1",
            "turn_1a",
            "Turn_1",
            "turn_99999999999999999999",
        ] {
            assert!(bad.parse::<TurnId>().is_err(), "{bad} accepted");
        }
        assert!(TurnId::new(0).is_none());
    }

    proptest! {
        #[test]
        fn turn_id_round_trips(n in 1u64..) {
            let id = TurnId::new(n).unwrap();
            prop_assert_eq!(id.to_string().parse::<TurnId>().unwrap(), id);
        }

        #[test]
        fn minted_id_round_trips(raw in any::<u128>()) {
            let id = EventId::from_ulid(Ulid(raw));
            prop_assert_eq!(id.to_string().parse::<EventId>().unwrap(), id);
        }

        #[test]
        fn slug_round_trips(s in "[a-z0-9][a-z0-9_-]{0,62}") {
            let id: AgentId = s.parse().unwrap();
            prop_assert_eq!(id.to_string(), s);
        }
    }
}
