//! A conversation's lifecycle as operators and users see it, shared by the API, the CLI and
//! the workers: deleting a conversation from every store (erasure, and retention's deletions),
//! the phases operators list, and the pieces both a deleter and a worker's owner need — the
//! lease fence and the failpoints tests crash a process at.
//!
//! It must not depend on the harness or the worker (`turnpike-agent`, `turnpike-worker`): the
//! edge uses it, and editing how an agent runs must not rebuild the edge.
//!
//! # Layout
//! - [`erasure`]: deleting a conversation from every store, with a tombstone; finishing
//!   cut-short deletions
//! - [`phases`]: conversation phases and conditions for operators (`conversation list`)
//! - [`fence`]: a lease holder's deadline; fenced writes stop before it lapses
//! - [`failpoints`]: where tests crash a process at a step boundary (a test-only feature)
//!
//! The book: `book/src/guides/lifecycle.md` (and `book/src/SUMMARY.md` for the rest).

pub mod erasure;
pub mod failpoints;
pub mod fence;
pub mod phases;

pub use failpoints::Failpoints;
pub use fence::{Fence, Fenced};
