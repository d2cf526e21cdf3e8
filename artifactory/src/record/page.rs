//! Reading a record by entry position, for clients that keep a cursor: the entries after a
//! position, or the last ones before it. Batches are found by binary search over their
//! positions, so a page costs O(log batches + page) reads, whatever the record's length.

use super::{Head, Record, RecordEntry};
use crate::error::Result;

/// One page of entries.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryPage {
    /// The entries, in record order.
    pub entries: Vec<RecordEntry>,
    /// The record's entry count when the page was read.
    pub leaves: u64,
}

impl Record {
    /// The batch holding entry `position`, by binary search (`None` past the end).
    async fn batch_of(&self, head: &Head, position: u64) -> Result<Option<u64>> {
        if position >= head.leaves() {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0, head.batches().saturating_sub(1));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let batch = self.read_stored(mid).await?;
            let last = batch.entries.last().map_or(0, |e| e.position);
            if last >= position {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(Some(lo))
    }

    /// Up to `limit` entries at positions `from` and after, in order (whole batches are read;
    /// the page ends at `limit` entries or the head).
    pub async fn page_from(&self, from: u64, limit: usize) -> Result<EntryPage> {
        let head = self.head().await?;
        let mut entries = Vec::new();
        let Some(mut seq) = self.batch_of(&head, from).await? else {
            return Ok(EntryPage {
                entries,
                leaves: head.leaves(),
            });
        };
        while seq < head.batches() && entries.len() < limit {
            let batch = self.read_stored(seq).await?;
            for entry in batch.entries {
                if entry.position >= from && entries.len() < limit {
                    entries.push(RecordEntry {
                        position: entry.position,
                        body: entry.decode()?,
                    });
                }
            }
            seq += 1;
        }
        Ok(EntryPage {
            entries,
            leaves: head.leaves(),
        })
    }

    /// Up to `limit` entries at positions before `before`: the last ones, in record order.
    pub async fn page_before(&self, before: u64, limit: usize) -> Result<EntryPage> {
        let head = self.head().await?;
        let mut entries: Vec<RecordEntry> = Vec::new();
        let last = before.min(head.leaves());
        if last == 0 || limit == 0 {
            return Ok(EntryPage {
                entries,
                leaves: head.leaves(),
            });
        }
        let Some(mut seq) = self.batch_of(&head, last - 1).await? else {
            return Ok(EntryPage {
                entries,
                leaves: head.leaves(),
            });
        };
        loop {
            let batch = self.read_stored(seq).await?;
            let mut taken = Vec::new();
            for entry in batch.entries.iter().rev() {
                if entry.position < last && entries.len() + taken.len() < limit {
                    taken.push(RecordEntry {
                        position: entry.position,
                        body: entry.decode()?,
                    });
                }
            }
            taken.reverse();
            taken.append(&mut entries);
            entries = taken;
            if entries.len() >= limit || seq == 0 {
                break;
            }
            seq -= 1;
        }
        Ok(EntryPage {
            entries,
            leaves: head.leaves(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use turnpike_schemas::entry::{ConversationOpened, ErrorEntry};
    use turnpike_schemas::{ConversationId, EntryBody};

    use crate::keys::RecordSigner;
    use crate::layout::ConversationPrefix;
    use crate::record::Record;

    fn opened() -> EntryBody {
        EntryBody::ConversationOpened(ConversationOpened {
            tenant: "t".parse().unwrap(),
            owner: "local:a".parse().unwrap(),
            app: "app".parse().unwrap(),
            agent: "agent".parse().unwrap(),
            at_ms: 1,
        })
    }

    #[tokio::test]
    async fn pages_forwards_and_backwards_cover_every_entry_once() {
        let record = Record::new(
            Arc::new(InMemory::new()),
            ConversationPrefix::new("t".parse().unwrap(), ConversationId::new()),
        );
        let signer = RecordSigner::from_seed([7; 32]);
        let mut head = record.head().await.unwrap();
        head = record.append(&signer, &head, &[opened()]).await.unwrap();
        // Batches of varying sizes: 1, 2, 3, … entries plus each batch's signed root.
        for n in 1..=9 {
            let bodies: Vec<EntryBody> = (0..n)
                .map(|i| {
                    EntryBody::Error(ErrorEntry {
                        turn: None,
                        message: format!("{n}.{i}"),
                    })
                })
                .collect();
            head = record.append(&signer, &head, &bodies).await.unwrap();
        }
        let all = record.entries().await.unwrap();
        assert_eq!(all.len() as u64, head.leaves());
        for from in [0, 1, 5, 17, 30, head.leaves() - 1, head.leaves(), 999] {
            for limit in [1, 3, 7, 100] {
                let page = record.page_from(from, limit).await.unwrap();
                let want: Vec<_> = all
                    .iter()
                    .filter(|e| e.position >= from)
                    .take(limit)
                    .cloned()
                    .collect();
                assert_eq!(page.entries, want, "from {from} limit {limit}");
                assert_eq!(page.leaves, head.leaves());
                let page = record.page_before(from, limit).await.unwrap();
                let mut want: Vec<_> = all
                    .iter()
                    .filter(|e| e.position < from)
                    .rev()
                    .take(limit)
                    .cloned()
                    .collect();
                want.reverse();
                assert_eq!(page.entries, want, "before {from} limit {limit}");
            }
        }
    }
}
