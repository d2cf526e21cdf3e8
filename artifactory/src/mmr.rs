//! A Merkle Mountain Range over SHA-256, kept as its peaks only.
//!
//! Appending is amortised O(1) and the state is O(log n) hashes, which is all the record needs:
//! it signs roots and re-derives them; it does not serve inclusion proofs (yet).
//!
//! Hashes are domain-separated: `0x00` for leaves, `0x01` for inner nodes, `0x02` for the root
//! ("bagging" the peaks together with the leaf count).

use sha2::{Digest as _, Sha256};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// Hashes one record entry: its position, kind and payload, each length-prefixed.
pub fn leaf_hash(position: u64, kind: &str, payload: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0x00]);
    h.update(position.to_be_bytes());
    h.update((kind.len() as u64).to_be_bytes());
    h.update(kind.as_bytes());
    h.update((payload.len() as u64).to_be_bytes());
    h.update(payload);
    h.finalize().into()
}

fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([0x01]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The peaks of a Merkle Mountain Range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mmr {
    leaves: u64,
    /// Peaks from the highest (leftmost) to the lowest, with their heights.
    peaks: Vec<(u32, Hash)>,
}

impl Mmr {
    /// An empty range.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a range from its leaf count and peaks (as returned by [`Mmr::peaks`]).
    ///
    /// Returns `None` when the number of peaks does not fit the leaf count.
    pub fn from_peaks(leaves: u64, peaks: Vec<Hash>) -> Option<Self> {
        if peaks.len() != leaves.count_ones() as usize {
            return None;
        }
        // A peak of height h exists for every set bit h of the leaf count, highest first.
        let heights = (0..64u32).rev().filter(|h| leaves & (1u64 << h) != 0);
        Some(Mmr {
            leaves,
            peaks: heights.zip(peaks).collect(),
        })
    }

    /// How many leaves the range holds.
    pub fn leaves(&self) -> u64 {
        self.leaves
    }

    /// The peak hashes, highest first.
    pub fn peaks(&self) -> Vec<Hash> {
        self.peaks.iter().map(|(_, h)| *h).collect()
    }

    /// Appends a leaf hash.
    pub fn push(&mut self, leaf: Hash) {
        let mut node = (0u32, leaf);
        while let Some(&(height, left)) = self.peaks.last() {
            if height != node.0 {
                break;
            }
            self.peaks.pop();
            node = (height + 1, node_hash(&left, &node.1));
        }
        self.peaks.push(node);
        self.leaves += 1;
    }

    /// The root: the peaks bagged together with the leaf count.
    pub fn root(&self) -> Hash {
        let mut h = Sha256::new();
        h.update([0x02]);
        h.update(self.leaves.to_be_bytes());
        for (_, peak) in &self.peaks {
            h.update(peak);
        }
        h.finalize().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leaf(i: u64) -> Hash {
        leaf_hash(i, "k", &i.to_le_bytes())
    }

    /// A direct, recursive computation of the same peaks, as a reference model.
    fn model_peaks(leaves: &[Hash]) -> Vec<Hash> {
        let mut out = Vec::new();
        let mut rest = leaves;
        while !rest.is_empty() {
            let size = 1usize << (usize::BITS - 1 - rest.len().leading_zeros());
            out.push(tree_root(&rest[..size]));
            rest = &rest[size..];
        }
        out
    }

    fn tree_root(leaves: &[Hash]) -> Hash {
        if leaves.len() == 1 {
            return leaves[0];
        }
        let mid = leaves.len() / 2;
        node_hash(&tree_root(&leaves[..mid]), &tree_root(&leaves[mid..]))
    }

    proptest! {
        #[test]
        fn matches_the_reference_model(n in 0u64..300) {
            let leaves: Vec<Hash> = (0..n).map(leaf).collect();
            let mut mmr = Mmr::new();
            for l in &leaves {
                mmr.push(*l);
            }
            prop_assert_eq!(mmr.leaves(), n);
            prop_assert_eq!(mmr.peaks(), model_peaks(&leaves));
        }

        #[test]
        fn resumes_from_peaks(a in 0u64..200, b in 0u64..50) {
            let mut whole = Mmr::new();
            for i in 0..a + b {
                whole.push(leaf(i));
            }
            let mut first = Mmr::new();
            for i in 0..a {
                first.push(leaf(i));
            }
            let mut resumed = Mmr::from_peaks(first.leaves(), first.peaks()).unwrap();
            for i in a..a + b {
                resumed.push(leaf(i));
            }
            prop_assert_eq!(resumed.root(), whole.root());
        }
    }

    #[test]
    fn any_change_changes_the_root() {
        let build = |f: &dyn Fn(u64) -> Hash| {
            let mut m = Mmr::new();
            for i in 0..10 {
                m.push(f(i));
            }
            m.root()
        };
        let base = build(&leaf);
        assert_ne!(base, build(&|i| if i == 3 { leaf(4) } else { leaf(i) }));
        let mut shorter = Mmr::new();
        for i in 0..9 {
            shorter.push(leaf(i));
        }
        assert_ne!(base, shorter.root());
        assert!(Mmr::from_peaks(3, vec![[0; 32]]).is_none());
    }
}
