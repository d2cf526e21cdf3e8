//! How an event reaches a worker: lanes, wakes and leases on a bus, with two backends.
//!
//! It must not run turns or write the record: it moves events and decides who may own a
//! conversation (leases), nothing more.
//!
//! # Layout
//! - [`bus`]: the [`Bus`] trait and its contract; wakes
//! - [`clock`]: the time leases and owners read (pausable in tests)
//! - [`lane`]: lane messages, reading them (unreadable ones handed over), dedupe ids
//! - [`lease`]: one owner per conversation, the claim rule and the fencing epoch
//! - [`jetstream`]: the NATS JetStream backend (fleet)
//! - [`embedded`]: the in-process backend, durable on local disk (`turnpike serve`)
//! - [`subject`]: every name on the bus, built in one place
//! - [`heartbeat`]: workers saying they are alive, and listing them
//! - [`settle`]: what becomes of a wake (ack, nak with a delay, terminate): one pure rule
//! - [`layout`]: the persisted lane layout (shard count, stream epochs) every process checks
//! - [`ingress`]: validating, authorising and publishing events
//! - [`trace`]: the accepting span's trace context, carried beside an event to its turn
//! - [`usage`]: the usage ledger (per tenant and app, per UTC day) and budgets
//! - [`error`]: the crate's error type
//!
//! The book: `book/src/concepts/turn.md`, `book/src/operating/fleet.md` (and `book/src/SUMMARY.md` for the rest).

pub mod bus;
pub mod clock;
pub mod embedded;
pub mod error;
pub mod heartbeat;
pub mod ingress;
pub mod jetstream;
pub mod lane;
pub mod layout;
pub mod lease;
pub mod recent;
pub mod settle;
pub mod subject;
pub mod trace;
pub mod usage;

pub use bus::{Bus, LaneMessage, Lease, Published, Wake};
pub use embedded::EmbeddedBus;
pub use error::{Error, ErrorKind, Result};
pub use heartbeat::Heartbeat;
pub use ingress::{Ingress, Trigger};
pub use jetstream::{JetStreamBus, JetStreamConfig};
pub use subject::Shards;
