//! Names on the bus: lane streams, lane subjects, the dispatch consumer, the lease bucket.
//! Every subject is built here and nowhere else.
//!
//! A conversation's shard is a stable hash of its id (FNV-1a, 64 bit) modulo the shard count,
//! fixed for a deployment: changing the shard count moves lanes, so it is a migration.

use turnpike_schemas::ConversationId;

/// The default number of lane streams.
pub const DEFAULT_SHARDS: u32 = 8;
/// The durable pull consumer every worker shares, one per lane stream.
pub const DISPATCH_CONSUMER: &str = "dispatch";
/// The stream of conversation leases (one message per conversation).
pub const LEASE_STREAM: &str = "TP_LEASES";
/// The subjects of the lease stream.
pub const LEASE_SUBJECTS: &str = "tp.lease.>";

/// The stream of the usage ledger (one message per counter and day).
pub const USAGE_STREAM: &str = "TP_USAGE";
/// The subjects of the usage stream.
pub const USAGE_SUBJECTS: &str = "tp.usage.>";

/// The subject of a usage counter's key ([`crate::usage::UsageScope::key`]).
pub fn usage_subject(key: &str) -> String {
    format!("tp.usage.{key}")
}

/// The lease subject of a conversation: `tp.lease.{conv}`.
pub fn lease_subject(conversation: ConversationId) -> String {
    format!("tp.lease.{conversation}")
}

/// The lane layout of a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shards {
    count: u32,
}

impl Shards {
    /// `count` lane streams (at least one).
    pub fn new(count: u32) -> Self {
        Self {
            count: count.max(1),
        }
    }

    /// How many lane streams there are.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The shard of a conversation.
    pub fn shard_of(&self, conversation: ConversationId) -> u32 {
        (fnv1a(&conversation.ulid().to_bytes()) % self.count as u64) as u32
    }

    /// The stream of shard `k`: `TP_LANES_{k}`.
    pub fn stream(&self, k: u32) -> String {
        format!("TP_LANES_{k}")
    }

    /// The subjects the stream of shard `k` holds: `tp.lane.{k}.>`.
    pub fn stream_subjects(&self, k: u32) -> String {
        format!("tp.lane.{k}.>")
    }

    /// A conversation's lane subject: `tp.lane.{k}.{conv}`.
    pub fn lane_subject(&self, conversation: ConversationId) -> String {
        format!("tp.lane.{}.{conversation}", self.shard_of(conversation))
    }

    /// The stream holding a conversation's lane.
    pub fn lane_stream(&self, conversation: ConversationId) -> String {
        self.stream(self.shard_of(conversation))
    }
}

impl Default for Shards {
    fn default() -> Self {
        Self::new(DEFAULT_SHARDS)
    }
}

/// A worker's heartbeats: `tp.heartbeat.{worker}` (core NATS, advisory).
pub fn heartbeat_subject(worker: turnpike_schemas::WorkerId) -> String {
    format!("tp.heartbeat.{worker}")
}

/// Every worker's heartbeats.
pub const HEARTBEATS: &str = "tp.heartbeat.>";

/// Advisory live deltas of a conversation: `tp.live.{conv}`.
pub fn live_subject(conversation: ConversationId) -> String {
    format!("tp.live.{conversation}")
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= *b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn subjects_have_the_documented_shape() {
        let shards = Shards::new(8);
        let conv: ConversationId = "conv_01HZY3W5R8G7V2T6Q4M9K0JX1C".parse().unwrap();
        let k = shards.shard_of(conv);
        assert!(k < 8);
        assert_eq!(shards.lane_subject(conv), format!("tp.lane.{k}.{conv}"));
        assert_eq!(shards.lane_stream(conv), format!("TP_LANES_{k}"));
        // Stable across builds: a fixed id always lands on the same shard.
        assert_eq!(k, shards.shard_of(conv));
        assert_eq!(Shards::new(0).count(), 1);
    }

    proptest! {
        #[test]
        fn conversations_spread_over_shards(seed in any::<u64>()) {
            let shards = Shards::new(8);
            let mut counts = [0u32; 8];
            for i in 0..800u64 {
                let ulid = ulid::Ulid::from_parts(seed.wrapping_add(i) >> 16, (i as u128) << 64 | seed as u128);
                counts[shards.shard_of(ConversationId::from_ulid(ulid)) as usize] += 1;
            }
            // Every shard gets a fair share (100 expected; generous bounds).
            prop_assert!(counts.iter().all(|c| *c > 40 && *c < 180), "{counts:?}");
        }
    }
}
