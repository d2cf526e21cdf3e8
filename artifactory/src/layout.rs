//! Where things live in the object store. Every key is built here and nowhere else.
//!
//! ```text
//! tenants/{tenant}/conversations/{conv}/record/{batch:020}
//! tenants/{tenant}/conversations/{conv}/record-head        a hint: a recent batch number
//! tenants/{tenant}/conversations/{conv}/turns/turn_{n}/log.json
//! tenants/{tenant}/conversations/{conv}/turns/turn_{n}/context.json   the timeline after turn n
//! tenants/{tenant}/conversations/{conv}/turns/turn_{n}/files/{path}
//! tenants/{tenant}/conversations/{conv}/attempts/turn_{n}/a{attempt:020}/…   what one attempt
//!     wrote (log.json, files/…; context.json from earlier versions), create-only; promoted to
//!     turns/turn_{n}/… once the record's turn_complete names that attempt (the context
//!     snapshot is written there directly, after that commit)
//! tenants/{tenant}/conversations/{conv}/attachments/turn_{n}/{id}/{name}
//! tenants/{tenant}/conversations/{conv}/forgotten/rows/{hash}     index rows the owner forgot
//! tenants/{tenant}/conversations/{conv}/forgotten/through/{turn:020}
//! directory/conversations/{conv}.json
//! directory/closed/{conv}, directory/grants/{conv}/{identity key}, directory/owners/{key}/{conv}
//! directory/idle/{conv}        a hint for the idle sweep: written when an owner lets go
//! tombstones/{tenant}/{conv}.json                 what proves a deletion (outside the data)
//! tombstones-pending/{tenant}/{conv}              while that deletion runs
//! ```

use object_store::path::Path;
use turnpike_schemas::{ConversationId, RefPath, TenantId, TurnId};

/// The store prefix of one conversation: `tenants/{tenant}/conversations/{conv}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConversationPrefix {
    tenant: TenantId,
    conversation: ConversationId,
    /// `tenants/{tenant}/conversations/{conv}`, made once: every key of the conversation
    /// starts with it, and a turn makes a dozen.
    base: std::sync::Arc<str>,
}

impl ConversationPrefix {
    /// The prefix of `conversation`, owned by `tenant`.
    pub fn new(tenant: TenantId, conversation: ConversationId) -> Self {
        let base = format!("tenants/{tenant}/conversations/{conversation}").into();
        Self {
            tenant,
            conversation,
            base,
        }
    }

    /// The owning tenant.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// The conversation.
    pub fn conversation(&self) -> ConversationId {
        self.conversation
    }

    /// The record's partition id, `conv-{id}`, as signed into every root.
    pub fn partition(&self) -> String {
        format!("conv-{}", self.conversation)
    }

    fn base(&self) -> &str {
        &self.base
    }

    /// The folder holding everything of the conversation (what a deletion removes).
    pub fn dir(&self) -> Path {
        key(self.base().to_owned())
    }

    /// The folder holding the record's batches.
    pub fn record_dir(&self) -> Path {
        key(format!("{}/record", self.base()))
    }

    /// The object of batch `seq`, zero-padded so that listing order is numeric order.
    pub fn record_batch(&self, seq: u64) -> Path {
        key(format!("{}/record/{seq:020}", self.base()))
    }

    /// The batch number of a key inside [`Self::record_dir`], if it is one.
    pub fn batch_seq(&self, path: &Path) -> Option<u64> {
        let name = path.filename()?;
        if name.len() != 20 || !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if path.as_ref() != self.record_batch(name.parse().ok()?).as_ref() {
            return None;
        }
        name.parse().ok()
    }

    /// The head hint: the number of a recent batch, written after appends. Never authoritative.
    pub fn record_hint(&self) -> Path {
        key(format!("{}/record-head", self.base()))
    }

    /// Where repaired batches' originals are kept.
    pub fn repaired_batch(&self, stamp_ms: u64, seq: u64) -> Path {
        key(format!(
            "{}/record-repaired/{stamp_ms}/{seq:020}",
            self.base()
        ))
    }

    /// Where the lane message at `lane_seq` is kept when it was parked as a dead letter.
    pub fn dead_letter(&self, lane_seq: u64) -> Path {
        key(format!("{}/dead-letters/{lane_seq:020}", self.base()))
    }

    /// The folder of the conversation's dead letters.
    pub fn dead_letter_dir(&self) -> Path {
        key(format!("{}/dead-letters", self.base()))
    }

    /// A repair's rewritten batches, before they replace the record's.
    pub fn repair_staged(&self, stamp_ms: u64, seq: u64) -> Path {
        key(format!(
            "{}/record-repair-staged/{stamp_ms}/{seq:020}",
            self.base()
        ))
    }

    /// The journal of a repair under way: present from the moment the rewritten record is
    /// staged until it has replaced the old one.
    pub fn repair_journal(&self) -> Path {
        key(format!("{}/record-repair-journal", self.base()))
    }

    /// The log of one turn.
    pub fn turn_log(&self, turn: TurnId) -> Path {
        key(format!("{}/turns/{turn}/log.json", self.base()))
    }

    /// The context snapshot after a turn.
    pub fn context_snapshot(&self, turn: TurnId) -> Path {
        key(format!("{}/turns/{turn}/context.json", self.base()))
    }

    /// A file hosted by a turn. The path was validated by the reference grammar.
    pub fn hosted_file(&self, turn: TurnId, path: &RefPath) -> Path {
        let mut out = format!("{}/turns/{turn}/files", self.base());
        for segment in path.segments() {
            out.push('/');
            out.push_str(segment);
        }
        Path::from(out)
    }

    /// Where one attempt at `turn` writes its side objects (turn log, context snapshot, hosted
    /// files) before the turn commits: `attempts/turn_{n}/a{attempt}/…`, mirroring
    /// `turns/turn_{n}/…`. Only the attempt the record's `turn_complete` names is promoted to
    /// the canonical keys; no other attempt's objects are ever read.
    pub fn attempt_dir(&self, turn: TurnId, attempt: u64) -> Path {
        key(format!("{}/attempts/{turn}/a{attempt:020}", self.base()))
    }

    fn turn_dir(&self, turn: TurnId) -> Path {
        key(format!("{}/turns/{turn}", self.base()))
    }

    /// `canonical` (a key under `turns/turn_{n}/`) as attempt `attempt` writes it. Works on
    /// path parts, so names with characters the store encodes are not encoded twice.
    pub fn in_attempt(&self, canonical: &Path, turn: TurnId, attempt: u64) -> Path {
        let turn_dir = self.turn_dir(turn);
        let rest = canonical
            .prefix_match(&turn_dir)
            .expect("a key of the turn's own folder");
        let mut out = self.attempt_dir(turn, attempt);
        for part in rest {
            out = out.join(part);
        }
        out
    }

    /// The canonical key of an object attempt `attempt` at `turn` wrote at `written`.
    pub fn promoted(&self, written: &Path, turn: TurnId, attempt: u64) -> Option<Path> {
        let rest = written.prefix_match(&self.attempt_dir(turn, attempt))?;
        let mut out = self.turn_dir(turn);
        let mut any = false;
        for part in rest {
            out = out.join(part);
            any = true;
        }
        any.then_some(out)
    }

    /// The folder of the conversation's git lineage (`…/git/objects/…`, `…/git/refs/…`).
    pub fn git_dir(&self) -> String {
        self.base().to_owned()
    }

    /// What the owner asked the index to forget of this conversation: `forgotten/rows/{hash
    /// of a row id}` and `forgotten/through/{turn:020}` (every row up to that turn).
    pub fn forgotten_dir(&self) -> Path {
        key(format!("{}/forgotten", self.base()))
    }

    /// The marker that forgets one row (named by a hash of its id: ids are references).
    pub fn forgotten_row(&self, row_hash: &str) -> Path {
        key(format!("{}/forgotten/rows/{row_hash}", self.base()))
    }

    /// The marker that forgets every row up to `turn`.
    pub fn forgotten_through(&self, turn: TurnId) -> Path {
        key(format!(
            "{}/forgotten/through/{:020}",
            self.base(),
            turn.number()
        ))
    }

    /// A file the user attached before `turn`: `attachments/turn_{n}/{path}`.
    pub fn attachment(&self, turn: TurnId, path: &RefPath) -> Path {
        let mut out = format!("{}/attachments/{turn}", self.base());
        for segment in path.segments() {
            out.push('/');
            out.push_str(segment);
        }
        Path::from(out)
    }
}

/// A key made of parts this module builds from ids and numbers (slugs, minted ids, hex,
/// digits, `_`, `-`, `.`), taken as it is: `Path::from` would split it and percent-encode each
/// part, which changes none of these characters. Anything else — a `.` or `..` part, an empty
/// one, another character — goes through `Path::from`, so the key is always the one
/// `Path::from` makes.
fn key(s: String) -> Path {
    let plain = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'.'));
    match plain.then(|| Path::parse(&s)) {
        Some(Ok(path)) => path,
        _ => Path::from(s),
    }
}

/// A short, path-safe key for an identity (identities may hold any printable characters).
pub fn identity_key(identity: &turnpike_schemas::Identity) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(identity.to_string().as_bytes())[..16])
}

/// The marker that lists a conversation under its owner.
pub fn owned_marker(owner: &turnpike_schemas::Identity, conversation: ConversationId) -> Path {
    key(format!(
        "directory/owners/{}/{conversation}",
        identity_key(owner)
    ))
}

/// The folder of an owner's markers.
pub fn owned_dir(owner: &turnpike_schemas::Identity) -> Path {
    key(format!("directory/owners/{}", identity_key(owner)))
}

/// The folder of the closed markers.
pub fn closed_dir() -> Path {
    Path::from("directory/closed")
}

/// The folder of a conversation's grants.
pub fn grants_dir(conversation: ConversationId) -> Path {
    key(format!("directory/grants/{conversation}"))
}

/// The tombstone of a deleted conversation.
pub fn tombstone(tenant: &TenantId, conversation: ConversationId) -> Path {
    key(format!("tombstones/{tenant}/{conversation}.json"))
}

/// The marker of a deletion that has not finished.
pub fn tombstone_pending(tenant: &TenantId, conversation: ConversationId) -> Path {
    key(format!("tombstones-pending/{tenant}/{conversation}"))
}

/// The folder of the pending-deletion markers.
pub fn tombstones_pending_dir() -> Path {
    Path::from("tombstones-pending")
}

/// A key's segments, as strings.
pub fn segments(path: &Path) -> Vec<String> {
    path.parts().map(|p| p.as_ref().to_owned()).collect()
}

/// The folder of the idle watches.
pub fn idle_dir() -> Path {
    Path::from("directory/idle")
}

/// The idle watch of a conversation: its write time is (about) its last activity.
pub fn idle_watch(conversation: ConversationId) -> Path {
    key(format!("directory/idle/{conversation}"))
}

/// The marker that says a conversation is closed.
pub fn closed_marker(conversation: ConversationId) -> Path {
    key(format!("directory/closed/{conversation}"))
}

/// The grant that lets `grantee` see a conversation it does not own.
pub fn grant_marker(conversation: ConversationId, grantee: &turnpike_schemas::Identity) -> Path {
    key(format!(
        "directory/grants/{conversation}/{}",
        identity_key(grantee)
    ))
}

/// Where the directory entry of a conversation lives.
pub fn directory_entry(conversation: ConversationId) -> Path {
    key(format!("directory/conversations/{conversation}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_keys_mirror_the_turn_folder_and_promote_back() {
        let p = ConversationPrefix::new("acme".parse().unwrap(), ConversationId::new());
        let turn = TurnId::new(7).unwrap();
        let file = p.hosted_file(turn, &RefPath::parse("out/report.md").unwrap());
        let odd = p.hosted_file(
            turn,
            &RefPath::parse("r%C3%A9sum%C3%A9%20~%5B1%5D%23.md").unwrap(),
        );
        for canonical in [p.turn_log(turn), p.context_snapshot(turn), file, odd] {
            let written = p.in_attempt(&canonical, turn, 42);
            assert!(written.as_ref().contains("/attempts/turn_7/a"), "{written}");
            assert_eq!(p.promoted(&written, turn, 42), Some(canonical.clone()));
            // Another attempt's object never promotes as this one's.
            assert_eq!(p.promoted(&written, turn, 43), None);
        }
    }

    #[test]
    fn a_key_is_the_one_path_from_makes() {
        for s in [
            "tenants/acme/conversations/conv_01J/turns/turn_3/log.json",
            "tombstones/a-b_c/conv_X.json",
            "a/./b",
            "a/../b",
            "a//b/",
            "/lead",
            "a/b c/%20/~/#/é",
            "..",
            "",
        ] {
            assert_eq!(key(s.to_owned()), Path::from(s), "{s:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_key_is_the_one_path_from_makes(s in "[a-z0-9_./%~ -]{0,24}") {
            proptest::prop_assert_eq!(key(s.clone()), Path::from(s));
        }
    }

    #[test]
    fn batch_keys_sort_numerically_and_parse_back() {
        let prefix = ConversationPrefix::new("acme".parse().unwrap(), ConversationId::new());
        let a = prefix.record_batch(9);
        let b = prefix.record_batch(10);
        assert!(a.as_ref() < b.as_ref());
        assert_eq!(prefix.batch_seq(&b), Some(10));
        assert_eq!(prefix.batch_seq(&prefix.turn_log(TurnId::FIRST)), None);
        let other = ConversationPrefix::new("acme".parse().unwrap(), ConversationId::new());
        assert_eq!(prefix.batch_seq(&other.record_batch(3)), None);
    }
}
