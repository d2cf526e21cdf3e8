//! The lane layout: how conversations map to lane streams, and which incarnation of each
//! stream holds their sequences. The record's `lane_through` is a position in one particular
//! stream: if the shard count changes (a conversation hashes to another stream) or a stream is
//! recreated (its sequences restart), positions no longer match and events would be skipped as
//! "already committed". So the layout is persisted once, and every process compares its own
//! with it at start and refuses to run on a mismatch ([`LaneLayout::check`]).

use serde::{Deserialize, Serialize};

/// One lane stream and its epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamEpoch {
    pub name: String,
    /// When the stream was created, as the server reports it.
    pub created: String,
}

/// The lane layout of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneLayout {
    pub shards: u32,
    pub streams: Vec<StreamEpoch>,
}

impl LaneLayout {
    /// Compares this process's layout with the persisted one: `Err` says what differs and
    /// what to do.
    pub fn check(&self, persisted: &LaneLayout) -> Result<(), String> {
        if self.shards != persisted.shards {
            return Err(format!(
                "this process runs {} lane shards but the deployment was set up with {}: conversations would map to other lanes; start with --shards {}",
                self.shards, persisted.shards, persisted.shards
            ));
        }
        for (mine, theirs) in self.streams.iter().zip(&persisted.streams) {
            if mine != theirs {
                return Err(format!(
                    "lane stream {} was recreated (created {}, the records were written against the one created {}): its sequences restarted and no longer match the records' lane positions; restore the stream, or migrate the lanes before starting",
                    mine.name, mine.created, theirs.created
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shards: u32, created: &str) -> LaneLayout {
        LaneLayout {
            shards,
            streams: (0..shards)
                .map(|k| StreamEpoch {
                    name: format!("TP_LANES_{k}"),
                    created: created.into(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_changed_shard_count_or_a_recreated_stream_is_refused() {
        let set_up = layout(4, "t0");
        assert!(layout(4, "t0").check(&set_up).is_ok());
        assert!(layout(8, "t0")
            .check(&set_up)
            .unwrap_err()
            .contains("--shards 4"));
        assert!(layout(4, "t1")
            .check(&set_up)
            .unwrap_err()
            .contains("recreated"));
    }
}
