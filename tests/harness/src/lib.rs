//! The test harness: starts real services on loopback and stops them with the tests.
//!
//! # Layout
//! - [`services`]: child processes on free loopback ports (moto's S3 server, …)
//! - [`nats`]: a JetStream server per test
//! - [`stores`]: object store backends for the shared suites (memory, local filesystem, S3)
//! - [`fixtures`]: small builders for conversations and records

pub mod fixtures;
pub mod nats;
pub mod services;
pub mod stores;
