//! Test collections in the SMART format (Cranfield and its kin) and the measures the search
//! benchmark reports: nDCG@10 and mean average precision.
//!
//! A collection directory holds a documents file (`.I` id, then fields such as `.T` title and
//! `.W` text), a queries file (`.I`, `.W`) and a judgments file of `query doc [grade …]` lines.
//! Files are recognised by their content, not their names.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};

/// How the judgments file names queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryNumbering {
    /// The query's 1-based position in the queries file (Cranfield's `cranqrel`).
    Position,
    /// The query's `.I` id.
    Id,
}

/// What a judgment's grade means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grades {
    /// 1 is the most relevant, 4 the least; gain = 5 − grade; anything else is not relevant
    /// (Cranfield's convention).
    LowerIsBetter,
    /// Gain = grade; ≤ 0 is not relevant.
    HigherIsBetter,
}

/// A parsed collection.
#[derive(Debug, Clone)]
pub struct Collection {
    /// (doc id, text)
    pub docs: Vec<(String, String)>,
    /// (query key as judgments name it, text)
    pub queries: Vec<(String, String)>,
    /// query key → doc id → gain (> 0)
    pub judgments: HashMap<String, HashMap<String, f64>>,
}

/// One SMART record: its `.I` id and its fields' text.
fn records(text: &str) -> Vec<(String, HashMap<char, String>)> {
    let mut out: Vec<(String, HashMap<char, String>)> = Vec::new();
    let mut field: Option<char> = None;
    for line in text.lines() {
        if let Some(id) = line.strip_prefix(".I") {
            out.push((id.trim().to_owned(), HashMap::new()));
            field = None;
            continue;
        }
        let mut chars = line.chars();
        if chars.next() == Some('.') {
            if let (Some(f), None) = (chars.next(), chars.next()) {
                field = Some(f);
                continue;
            }
        }
        if let (Some(f), Some((_, fields))) = (field, out.last_mut()) {
            let text = fields.entry(f).or_default();
            text.push_str(line.trim());
            text.push(' ');
        }
    }
    out
}

fn read(path: &Path) -> Result<String> {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))
}

impl Collection {
    /// Reads a collection from `dir`; says which file is missing or malformed.
    pub fn load(dir: &Path, numbering: QueryNumbering, grades: Grades) -> Result<Self> {
        let mut docs_file = None;
        let mut queries_file = None;
        let mut judgments_file = None;
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| Error::invalid(format!("{}: {e}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        entries.sort();
        for path in entries {
            let text = read(&path)?;
            if text.starts_with(".I") {
                if text.lines().any(|l| l.trim_end() == ".T") {
                    docs_file.get_or_insert((path, text));
                } else {
                    queries_file.get_or_insert((path, text));
                }
            } else if text.lines().take(5).all(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                (2..=3).contains(&cols.len()) && cols.iter().all(|c| c.parse::<i64>().is_ok())
            }) && !text.trim().is_empty()
            {
                judgments_file.get_or_insert((path, text));
            }
        }
        let missing = |what: &str| {
            Error::invalid(format!(
                "{} has no {what} (SMART format: documents with .I/.T/.W, queries with .I/.W, \
                 judgments as `query doc [grade]` lines)",
                dir.display()
            ))
        };
        let (_, docs_text) = docs_file.ok_or_else(|| missing("documents file"))?;
        let (_, queries_text) = queries_file.ok_or_else(|| missing("queries file"))?;
        let (judgments_path, judgments_text) =
            judgments_file.ok_or_else(|| missing("judgments file"))?;
        let docs: Vec<(String, String)> = records(&docs_text)
            .into_iter()
            .map(|(id, f)| {
                let text = [f.get(&'T'), f.get(&'W')]
                    .into_iter()
                    .flatten()
                    .map(|s| s.trim())
                    .collect::<Vec<_>>()
                    .join("\n");
                (id, text)
            })
            .collect();
        let queries: Vec<(String, String)> = records(&queries_text)
            .into_iter()
            .enumerate()
            .map(|(i, (id, f))| {
                let key = match numbering {
                    QueryNumbering::Position => (i + 1).to_string(),
                    QueryNumbering::Id => id.trim_start_matches('0').to_owned(),
                };
                (
                    key,
                    f.get(&'W').map(|s| s.trim().to_owned()).unwrap_or_default(),
                )
            })
            .collect();
        let mut judgments: HashMap<String, HashMap<String, f64>> = HashMap::new();
        for (n, line) in judgments_text.lines().enumerate() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.is_empty() {
                continue;
            }
            let bad = || {
                Error::invalid(format!(
                    "{} line {}: expected `query doc [grade]`, got {line:?}",
                    judgments_path.display(),
                    n + 1
                ))
            };
            let (query, doc) = match (cols.first(), cols.get(1)) {
                (Some(q), Some(d)) => (q.trim_start_matches('0'), *d),
                _ => return Err(bad()),
            };
            let grade: Option<f64> = match cols.get(2) {
                Some(g) => Some(g.parse().map_err(|_| bad())?),
                None => None,
            };
            let gain = match (grades, grade) {
                (_, None) => 1.0,
                (Grades::LowerIsBetter, Some(g)) if (1.0..=4.0).contains(&g) => 5.0 - g,
                (Grades::HigherIsBetter, Some(g)) if g > 0.0 => g,
                _ => continue,
            };
            judgments
                .entry(query.to_owned())
                .or_default()
                .insert(doc.to_owned(), gain);
        }
        Ok(Self {
            docs,
            queries,
            judgments,
        })
    }
}

/// nDCG at `k` of `ranking` (doc ids, best first) against one query's judgments.
pub fn ndcg_at(ranking: &[String], judged: &HashMap<String, f64>, k: usize) -> f64 {
    let dcg: f64 = ranking
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, d)| judged.get(d).copied().unwrap_or(0.0) / ((i + 2) as f64).log2())
        .sum();
    let mut ideal: Vec<f64> = judged.values().copied().collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, g)| g / ((i + 2) as f64).log2())
        .sum();
    if idcg == 0.0 {
        0.0
    } else {
        dcg / idcg
    }
}

/// Average precision of `ranking` (relevant: any positive gain), over all judged relevant docs.
pub fn average_precision(ranking: &[String], judged: &HashMap<String, f64>) -> f64 {
    if judged.is_empty() {
        return 0.0;
    }
    let mut hits = 0.0;
    let mut sum = 0.0;
    for (i, d) in ranking.iter().enumerate() {
        if judged.contains_key(d) {
            hits += 1.0;
            sum += hits / (i + 1) as f64;
        }
    }
    sum / judged.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn measures_match_hand_computed_values() {
        let judged: HashMap<String, f64> = [("a".to_string(), 3.0), ("b".to_string(), 1.0)].into();
        // Perfect order: 1.0.
        assert!((ndcg_at(&ids(&["a", "b", "x"]), &judged, 10) - 1.0).abs() < 1e-12);
        // Swapped: (1 + 3/log2 3) / (3 + 1/log2 3).
        let expected = (1.0 + 3.0 / 3f64.log2()) / (3.0 + 1.0 / 3f64.log2());
        assert!((ndcg_at(&ids(&["b", "a"]), &judged, 10) - expected).abs() < 1e-12);
        // AP: relevant at ranks 2 and 4 → (1/2 + 2/4) / 2.
        let ap = average_precision(&ids(&["x", "a", "y", "b"]), &judged);
        assert!((ap - 0.5).abs() < 1e-12);
        // Nothing relevant found.
        assert_eq!(average_precision(&ids(&["x"]), &judged), 0.0);
    }

    #[test]
    fn smart_records_keep_fields_apart() {
        let recs = records(".I 1\n.T\ntitle words\n.A\nsomeone\n.W\nbody\ntext\n.I 2\n.W\nq\n");
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].0, "1");
        assert_eq!(recs[0].1[&'T'].trim(), "title words");
        assert_eq!(recs[0].1[&'W'].trim(), "body text");
        assert_eq!(recs[1].1[&'W'].trim(), "q");
    }
}
