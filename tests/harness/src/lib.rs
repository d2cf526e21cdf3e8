//! The test harness: starts real services on loopback and stops them with the tests.
//!
//! # Layout
//! - [`services`]: child processes on free loopback ports (moto's S3 server, …)
//! - [`nats`]: a JetStream server per test
//! - [`postgres`]: PostgreSQL with pgvector, per test or shared by a test binary
//! - [`process`]: turnpike processes, killable on demand
//! - [`stores`]: object store backends for the shared suites (memory, local filesystem, S3)
//! - [`receiver`]: a webhook receiver that logs what it gets (and fails on purpose)
//! - [`counting`]: an object store that counts reads, for bounded-cost tests
//! - [`counting_bus`]: a bus that counts lane reads, for tests of how often workers ask it
//! - [`faulty`]: an object store that stops writing after a budget, as a killed process would
//! - [`git`]: the real `git` binary, for checking exports and mirrors
//! - [`index`]: the real embedding model for index tests
//! - [`llm`]: a real language model (llama.cpp's server, SmolLM2-135M) for model tests
//! - [`fixtures`]: small builders for conversations and records
//! - [`turns`]: a conversation with a scripted agent on one worker, for turn tests
//! - [`lanes`]: publishing many events and checking they were committed in order, once
//! - [`wait`]: waiting on a condition with a timeout
//! - [`shape`]: import circles between the modules of a crate, read from its source
//!
//! The book: `book/src/reference/features.md` (and `book/src/SUMMARY.md` for the rest).

pub mod counting;
pub mod counting_bus;
pub mod edge;
pub mod faulty;
pub mod fixtures;
pub mod fleet;
pub mod git;
pub mod index;
pub mod lanes;
pub mod llm;
pub mod nats;
pub mod postgres;
pub mod process;
pub mod receiver;
pub mod services;
pub mod shape;
pub mod stores;
pub mod turns;
pub mod wait;
