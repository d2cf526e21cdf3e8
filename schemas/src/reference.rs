//! The reference grammar, version 1.
//!
//! ```text
//! reference = "conv:" family ":" conversation "/" turn "/" path
//! family    = 2*16 lowercase ASCII letters          ; "tl" turn log, "fi" hosted file, "at" attachment, "gi" git
//! turn      = "turn_" positive decimal without leading zeros
//! path      = segment *( "/" segment )             ; 1 to 64 segments, at most 1024 bytes
//! segment   = 1*( unreserved / pct-encoded / non-ASCII character )
//! ```
//!
//! A reference *locates*; it never authorises. Only the resolver turns one into bytes, as the
//! bound identity.
//!
//! After one round of percent-decoding, a segment must be non-empty, must not be `.` or `..`,
//! and must not contain `/`, `\`, `%`, a control character or a look-alike of a dot or slash. So
//! `..`, absolute paths (an empty first segment), empty segments, control characters and their
//! percent-encoded forms — single or double encoded — are all refused. File names containing `%`
//! cannot be referenced; that is the price of making double encoding harmless.

use std::borrow::Cow;
use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;

use crate::error::{truncate, SchemaError, SchemaErrorKind};
use crate::ids::{string_serde, ConversationId, TurnId};

/// The longest path accepted, in bytes of its canonical (encoded) form.
pub const MAX_PATH_LEN: usize = 1024;
/// The most segments a path may have.
pub const MAX_SEGMENTS: usize = 64;

/// Which resolver family a reference belongs to (`tl`, `fi`, `at`, `gi`, …).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Family(Cow<'static, str>);

impl Family {
    /// Turn logs: a block of a turn's log.
    pub fn turn_log() -> Self {
        Family(Cow::Borrowed("tl"))
    }
    /// Files hosted by a turn.
    pub fn hosted_file() -> Self {
        Family(Cow::Borrowed("fi"))
    }
    /// Attachments uploaded into a conversation.
    pub fn attachment() -> Self {
        Family(Cow::Borrowed("at"))
    }
    /// A file at a turn's project version in the git lineage.
    pub fn git() -> Self {
        Family(Cow::Borrowed("gi"))
    }

    /// The family as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Family {
    type Err = SchemaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if (2..=16).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase()) {
            Ok(Family(Cow::Owned(s.to_owned())))
        } else {
            Err(invalid(
                s,
                "the family must be 2–16 lowercase ASCII letters",
            ))
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A relative path inside a turn, as validated, decoded segments.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RefPath(Vec<String>);

impl RefPath {
    /// Builds a path from decoded segments, validating each.
    pub fn from_segments<I, S>(segments: I) -> Result<Self, SchemaError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let segments: Vec<String> = segments.into_iter().map(Into::into).collect();
        let path = RefPath(segments);
        path.validate(&path.to_string())?;
        Ok(path)
    }

    /// The path of block `index` of a turn's log: `blocks/<index>`. Valid by construction (two
    /// short segments of letters and digits), so it skips the checks and the formatting that
    /// [`Self::from_segments`] does: a context rebuild makes one per row.
    pub fn block(index: usize) -> Self {
        RefPath(vec!["blocks".to_owned(), index.to_string()])
    }

    /// Parses a `/`-separated relative path (percent-encoded as in a reference).
    pub fn parse(text: &str) -> Result<Self, SchemaError> {
        if text.is_empty() {
            return Err(invalid(text, "the path is empty"));
        }
        if text.len() > MAX_PATH_LEN {
            return Err(invalid(text, "the path is longer than 1024 bytes"));
        }
        let mut segments = Vec::new();
        for raw in text.split('/') {
            if raw.is_empty() {
                return Err(invalid(
                    text,
                    "empty path segment (absolute paths and `//` are not allowed)",
                ));
            }
            segments.push(percent_decode(raw).map_err(|why| invalid(text, why))?);
        }
        let path = RefPath(segments);
        path.validate(text)?;
        Ok(path)
    }

    /// The decoded segments.
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// The decoded segments joined with `/`: safe to join onto a directory.
    pub fn to_relative_path(&self) -> String {
        self.0.join("/")
    }

    fn validate(&self, text: &str) -> Result<(), SchemaError> {
        if self.0.is_empty() {
            return Err(invalid(text, "the path is empty"));
        }
        // The limit applies to the canonical (encoded) form, so that whatever is accepted
        // prints as something that is accepted again.
        if self.to_string().len() > MAX_PATH_LEN {
            return Err(invalid(
                text,
                "the path is longer than 1024 bytes once encoded",
            ));
        }
        if self.0.len() > MAX_SEGMENTS {
            return Err(invalid(text, "the path has more than 64 segments"));
        }
        for segment in &self.0 {
            check_segment(segment).map_err(|why| invalid(text, why))?;
        }
        Ok(())
    }
}

impl fmt::Display for RefPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_char('/')?;
            }
            percent_encode(segment, f)?;
        }
        Ok(())
    }
}

impl fmt::Debug for RefPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `conv:<family>:<conversation>/turn_<n>/<path>`: where something of a conversation is.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    family: Family,
    conversation: ConversationId,
    turn: TurnId,
    path: RefPath,
}

impl Reference {
    /// Assembles a reference from validated parts.
    pub fn new(family: Family, conversation: ConversationId, turn: TurnId, path: RefPath) -> Self {
        Self {
            family,
            conversation,
            turn,
            path,
        }
    }

    /// The resolver family.
    pub fn family(&self) -> &Family {
        &self.family
    }
    /// The conversation the reference points into.
    pub fn conversation(&self) -> ConversationId {
        self.conversation
    }
    /// The turn the reference points into.
    pub fn turn(&self) -> TurnId {
        self.turn
    }
    /// The path inside the turn.
    pub fn path(&self) -> &RefPath {
        &self.path
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conv:{}:{}/{}/{}",
            self.family, self.conversation, self.turn, self.path
        )
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Reference {
    type Err = SchemaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > MAX_PATH_LEN + 128 {
            return Err(invalid(s, "longer than a reference can be"));
        }
        let rest = s
            .strip_prefix("conv:")
            .ok_or_else(|| invalid(s, "a reference starts with `conv:`"))?;
        let (family, rest) = rest
            .split_once(':')
            .ok_or_else(|| invalid(s, "expected `conv:<family>:<conversation>/…`"))?;
        let family: Family = family.parse()?;
        let (conversation, rest) = rest
            .split_once('/')
            .ok_or_else(|| invalid(s, "expected `/turn_<n>/` after the conversation"))?;
        let conversation: ConversationId = conversation
            .parse()
            .map_err(|e: SchemaError| invalid(s, &e.to_string()))?;
        let (turn, path) = rest
            .split_once('/')
            .ok_or_else(|| invalid(s, "expected a path after `turn_<n>/`"))?;
        let turn: TurnId = turn
            .parse()
            .map_err(|e: SchemaError| invalid(s, &e.to_string()))?;
        let path = RefPath::parse(path).map_err(|e| invalid(s, &e.to_string()))?;
        Ok(Reference {
            family,
            conversation,
            turn,
            path,
        })
    }
}

string_serde!(Reference);

fn invalid(input: &str, why: &str) -> SchemaError {
    SchemaError::new(
        SchemaErrorKind::InvalidReference,
        format!("invalid reference {:?}: {why}", truncate(input)),
    )
}

/// Characters that some normalisers turn into `.` or `/`.
const LOOKALIKES: [char; 7] = [
    '\u{2024}', // one dot leader
    '\u{FE52}', // small full stop
    '\u{FF0E}', // fullwidth full stop
    '\u{2215}', // division slash
    '\u{2044}', // fraction slash
    '\u{FF0F}', // fullwidth solidus
    '\u{29F8}', // big solidus
];

fn check_segment(segment: &str) -> Result<(), &'static str> {
    if segment.is_empty() {
        return Err("empty path segment");
    }
    if segment == "." || segment == ".." {
        return Err("`.` and `..` segments are not allowed");
    }
    for c in segment.chars() {
        match c {
            '/' | '\\' => return Err("a segment contains a slash or backslash"),
            '%' => return Err("a segment contains `%` after decoding (double encoding)"),
            c if c.is_control() => return Err("a segment contains a control character"),
            c if LOOKALIKES.contains(&c) => {
                return Err("a segment contains a look-alike of `.` or `/`")
            }
            _ => {}
        }
    }
    Ok(())
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn percent_encode(segment: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for b in segment.bytes() {
        if is_unreserved(b) {
            f.write_char(b as char)?;
        } else {
            write!(f, "%{b:02X}")?;
        }
    }
    Ok(())
}

fn percent_decode(raw: &str) -> Result<String, &'static str> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .ok_or("a `%` is not followed by two hex digits")?;
            let hi = (hex[0] as char)
                .to_digit(16)
                .ok_or("a `%` is not followed by two hex digits")?;
            let lo = (hex[1] as char)
                .to_digit(16)
                .ok_or("a `%` is not followed by two hex digits")?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-encoded bytes are not UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CONV: &str = "conv_01HZY3W5R8G7V2T6Q4M9K0JX1C";

    fn reference(path: &str) -> String {
        format!("conv:fi:{CONV}/turn_3/{path}")
    }

    #[test]
    fn parses_a_plain_reference() {
        let r: Reference = reference("out/report.csv").parse().unwrap();
        assert_eq!(r.family(), &Family::hosted_file());
        assert_eq!(r.conversation().to_string(), CONV);
        assert_eq!(r.turn().number(), 3);
        assert_eq!(r.path().segments(), ["out", "report.csv"]);
        assert_eq!(r.to_string(), reference("out/report.csv"));
    }

    #[test]
    fn decodes_and_re_encodes_special_characters() {
        let r: Reference = reference("my%20file%C3%A9.txt").parse().unwrap();
        assert_eq!(r.path().segments(), ["my fileé.txt"]);
        assert_eq!(r.to_string(), reference("my%20file%C3%A9.txt"));
        // A raw non-ASCII character is accepted and printed in canonical (encoded) form.
        let raw: Reference = reference("é").parse().unwrap();
        assert_eq!(raw.to_string(), reference("%C3%A9"));
    }

    #[test]
    fn rejects_hostile_inputs() {
        let hostile_paths = [
            "..",
            "../etc/passwd",
            "a/../../b",
            ".",
            "a/./b",
            "%2e%2e",
            "%2E%2E/secret",
            ".%2e",
            "%2e.",
            "%252e%252e",
            "%25",
            "/etc/passwd",
            "%2fetc%2fpasswd",
            "a%2F..%2Fb",
            "a//b",
            "a/",
            "",
            "a\\..\\b",
            "a%5c..%5cb",
            "a\u{0}b",
            "a%00b",
            "a%0ab",
            "a\nb",
            "a%7Fb",
            "a%C2%85b",
            "%",
            "a%2",
            "a%zz",
            "%ff%fe",
            "\u{FF0E}\u{FF0E}",
            "a\u{2215}b",
        ];
        for path in hostile_paths {
            let input = reference(path);
            let err = input.parse::<Reference>().unwrap_err();
            assert_eq!(err.kind(), &SchemaErrorKind::InvalidReference, "{path:?}");
        }
        let hostile_whole = [
            "",
            "conv:",
            "file:///etc/passwd",
            &format!("conv:FI:{CONV}/turn_3/a"),
            &format!("conv:f:{CONV}/turn_3/a"),
            &format!("conv:fi:{CONV}/turn_0/a"),
            &format!("conv:fi:{CONV}/turn_03/a"),
            &format!("conv:fi:{CONV}/turn_3"),
            &format!("conv:fi:{CONV}/a"),
            &format!("conv:fi:{}/turn_3/a", CONV.to_lowercase()),
            "conv:fi:conv_../turn_3/a",
            &format!("conv:fi:{CONV}/turn_3/{}", "a/".repeat(64) + "a"),
            &format!("conv:fi:{CONV}/turn_3/{}", "a".repeat(2000)),
        ];
        for input in hostile_whole {
            assert!(input.parse::<Reference>().is_err(), "{input:?} accepted");
        }
    }

    #[test]
    fn the_length_limit_applies_to_the_canonical_form() {
        // 400 raw bytes, 1,200 once encoded: refused, since it could not be printed and read back.
        let raw = "é".repeat(200);
        assert!(reference(&raw).parse::<Reference>().is_err());
        let fits = "é".repeat(170);
        let r: Reference = reference(&fits).parse().unwrap();
        assert_eq!(r.to_string().parse::<Reference>().unwrap(), r);
    }

    #[test]
    fn a_block_path_is_the_one_its_segments_validate_to() {
        for index in [0, 7, 11, 4096, usize::MAX] {
            let path = RefPath::block(index);
            assert_eq!(
                path,
                RefPath::from_segments(["blocks".to_owned(), index.to_string()]).unwrap()
            );
            assert_eq!(RefPath::parse(&path.to_string()).unwrap(), path);
        }
    }

    #[test]
    fn segments_are_validated_when_built_directly() {
        assert!(RefPath::from_segments(["ok", ".."]).is_err());
        assert!(RefPath::from_segments(["a/b"]).is_err());
        assert!(RefPath::from_segments(Vec::<String>::new()).is_err());
        assert_eq!(
            RefPath::from_segments(["a b", "c"]).unwrap().to_string(),
            "a%20b/c"
        );
    }

    fn segment() -> impl Strategy<Value = String> {
        "[^/\\\\%\\p{Cc}]{1,12}"
            .prop_filter("dot segments and look-alikes", |s| check_segment(s).is_ok())
    }

    proptest! {
        #[test]
        fn round_trips(family in "[a-z]{2,16}", ulid in any::<u128>(), turn in 1u64..1_000_000, segments in proptest::collection::vec(segment(), 1..8)) {
            let r = Reference::new(
                family.parse().unwrap(),
                ConversationId::from_ulid(ulid::Ulid(ulid)),
                TurnId::new(turn).unwrap(),
                RefPath::from_segments(segments).unwrap(),
            );
            let text = r.to_string();
            let parsed: Reference = text.parse().unwrap();
            prop_assert_eq!(&parsed, &r);
            prop_assert_eq!(parsed.to_string(), text);
            let json = serde_json::to_string(&r).unwrap();
            prop_assert_eq!(serde_json::from_str::<Reference>(&json).unwrap(), r);
        }

        #[test]
        fn never_panics_and_accepted_paths_are_safe(input in "\\PC{0,64}") {
            if let Ok(r) = reference(&input).parse::<Reference>() {
                for s in r.path().segments() {
                    prop_assert!(check_segment(s).is_ok());
                }
                prop_assert_eq!(r.to_string().parse::<Reference>().unwrap(), r);
            }
        }
    }
}
