//! Turnpike's durable side: the signed conversation record, turn logs and the directory.
//!
//! It must not know how events travel or how turns run: it depends on `schemas` only, and
//! every writer above it (worker, edge, lifecycle) brings its own fence.
//!
//! # Layout
//! - [`record`]: the append-only, signed, verifiable record of one conversation
//! - [`mmr`]: the Merkle Mountain Range under the record's roots
//! - [`keys`]: ed25519 signing keys and trusted public keys
//! - `verified`: signatures this process already knows to be valid (verified once, not twice)
//! - [`turnlogs`]: one object per turn
//! - [`attempts`]: side objects written per attempt, promoted once the record commits one
//! - [`git`]: project versions, one immutable ref per successful turn
//! - [`files`]: files turns hosted and files users attached
//! - [`conversations`]: creating and opening conversations as an identity
//! - [`directory`]: which tenant owns a conversation, and who may see it
//! - [`layout`]: every object key, built in one place
//! - [`store`]: opening an object store (memory, local filesystem, S3-compatible)
//! - [`sqlite_store`]: the local store in one SQLite database, with group commit
//! - [`synced`]: the local filesystem store with fsync of each object and its directory
//! - [`open_turns`]: marks of conversations whose record may end in an open turn (the sweep)
//! - [`dead_letters`]: lane messages set aside (unreadable or refused) for an operator
//! - [`hooks`]: inbound webhook deliveries, each claimed once, and the conversations keys name
//! - [`schedules`]: schedules and the create-only claims that make each firing happen once
//!
//! The book: `book/src/concepts/turn.md` (and `book/src/SUMMARY.md` for the rest).

pub mod archive;
pub mod attempts;
pub mod connections;
mod context_cache;
pub mod conversations;
pub mod dead_letters;
pub mod directory;
pub mod error;
pub mod files;
pub mod forgotten;
pub mod git;
pub mod hooks;
pub mod keys;
pub mod layout;
pub mod mmr;
pub mod open_turns;
pub mod record;
pub mod schedules;
pub mod sqlite_store;
pub mod store;
pub mod synced;
pub mod tasks;
pub mod tombstones;
pub mod turnlogs;
mod verified;
pub mod webhooks;

pub use connections::{Connection, ConnectionKey, Connections, Secret};
pub use conversations::{Conversations, NewConversation};
pub use dead_letters::{DeadLetter, DeadLetters};
pub use directory::{Directory, DirectoryEntry};
pub use error::{Error, ErrorKind, Result};
pub use files::Files;
pub use forgotten::{ForgetList, Forgotten};
pub use keys::{RecordSigner, TrustedKeys};
pub use layout::ConversationPrefix;
pub use open_turns::OpenTurns;
pub use record::{Checkpoint, Head, Record, RecordEntry, Transcript, TurnEnd, Verdict};
pub use schedules::Schedules;
pub use store::{open_local, open_store, open_store_with, LocalLayout, SyncedWithNext};
pub use tombstones::{Tombstone, Tombstones};
pub use turnlogs::TurnLogs;
pub use webhooks::Webhooks;
