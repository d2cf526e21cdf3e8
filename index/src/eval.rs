//! Test collections in the SMART format (Cranfield, CISI, CACM, MED and their kin) and the
//! measures the search benchmark reports: nDCG@10 and mean average precision.
//!
//! A collection is a documents file (`.I` id, then fields such as `.T` title, `.A` authors,
//! `.W` text), a queries file (the same shape; some carry `.T`/`.A`/`.B`/`.N` fields too) and a
//! judgments file, in one of the shapes the collections are distributed in:
//! - `query doc` or `query doc grade` (Cranfield's `cranqrel`);
//! - `query doc 0 0.0` — four columns, the last two unused (CISI, CACM);
//! - TREC qrels, `query 0 doc relevance` (MED as redistributed, and TREC itself).
//!
//! Files are recognised by their content (of the two `.I` files, the one with more records
//! holds the documents; of several judgments files, one of `query doc [grade]` lines comes
//! first); where that cannot tell, [`Files`] names them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

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

/// The shape of the judgments file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JudgmentsFormat {
    /// Told apart by the content (see the module's list); ambiguous files are refused.
    #[default]
    Auto,
    /// `query doc [grade [unused]]`.
    Smart,
    /// `query iteration doc relevance` (relevance > 0 is relevant, higher is better).
    Trec,
}

/// The files of a collection, where guessing cannot tell (each is guessed when `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Files {
    pub docs: Option<PathBuf>,
    pub queries: Option<PathBuf>,
    pub judgments: Option<PathBuf>,
    pub judgments_format: JudgmentsFormat,
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

/// A record's searchable text: its title and its text (`.T`, `.W`), never authors, sources or
/// cross-references.
fn record_text(fields: &HashMap<char, String>) -> String {
    [fields.get(&'T'), fields.get(&'W')]
        .into_iter()
        .flatten()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

fn read(path: &Path) -> Result<String> {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))
}

/// Whether a judgments line's columns are all numbers (ids, grades, `0.000000`).
fn numeric_line(line: &str) -> bool {
    let cols: Vec<&str> = line.split_whitespace().collect();
    (2..=4).contains(&cols.len()) && cols.iter().all(|c| c.parse::<f64>().is_ok())
}

/// Whether a file looks like judgments: its first lines are all 2–4 numeric columns.
fn looks_like_judgments(text: &str) -> bool {
    !text.trim().is_empty()
        && text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .take(5)
            .all(numeric_line)
}

/// The shape of a judgments file with four columns, told by its content.
fn four_column_format(text: &str) -> Option<JudgmentsFormat> {
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|c| c.len() == 4)
        .collect();
    let constant = |i: usize| rows.iter().all(|r| r[i] == rows[0][i]);
    let zero = |i: usize| rows.iter().all(|r| r[i].parse::<f64>() == Ok(0.0));
    match (zero(1), constant(2) && constant(3)) {
        // TREC: the iteration column is always 0, the doc ids vary.
        (true, false) => Some(JudgmentsFormat::Trec),
        // SMART: the doc ids vary, the last two columns are placeholders.
        (false, true) => Some(JudgmentsFormat::Smart),
        _ => None,
    }
}

impl Collection {
    /// Reads a collection from `dir`, guessing every file; see [`Collection::load_files`].
    pub fn load(dir: &Path, numbering: QueryNumbering, grades: Grades) -> Result<Self> {
        Self::load_files(dir, &Files::default(), numbering, grades)
    }

    /// Reads a collection: the files `files` names, the others found in `dir` by their
    /// content. Says which file is missing, ambiguous or malformed, and which flag names it.
    pub fn load_files(
        dir: &Path,
        files: &Files,
        numbering: QueryNumbering,
        grades: Grades,
    ) -> Result<Self> {
        let mut smart: Vec<(PathBuf, String, usize)> = Vec::new();
        let mut judgments_file = None;
        let named: Vec<&PathBuf> = [&files.docs, &files.queries, &files.judgments]
            .into_iter()
            .flatten()
            .collect();
        if files.docs.is_none() || files.queries.is_none() || files.judgments.is_none() {
            let mut entries: Vec<_> = std::fs::read_dir(dir)
                .map_err(|e| Error::invalid(format!("{}: {e}", dir.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && !named.contains(&p))
                .collect();
            entries.sort();
            for path in entries {
                let text = read(&path)?;
                if text.starts_with(".I") {
                    let n = records(&text).len();
                    smart.push((path, text, n));
                } else if looks_like_judgments(&text) {
                    // Of several, the collection's own (`query doc [grade]`) before a four-
                    // column one (often a TREC conversion shipped beside it).
                    let four = text.lines().any(|l| l.split_whitespace().count() == 4);
                    let better = match &judgments_file {
                        None => true,
                        Some((_, _, was_four)) => *was_four && !four,
                    };
                    if better {
                        judgments_file = Some((path, text, four));
                    }
                }
            }
        }
        let flag = |what: &str, flag: &str| {
            Error::invalid(format!(
                "{}: cannot tell the {what} file by its content; name it with {flag}",
                dir.display()
            ))
        };
        // Of the unnamed `.I` files, the documents are the larger one.
        smart.sort_by_key(|s| std::cmp::Reverse(s.2));
        if files.docs.is_none()
            && files.queries.is_none()
            && smart.len() >= 2
            && smart[0].2 == smart[1].2
        {
            return Err(flag("documents", "--docs FILE (and --queries FILE)"));
        }
        let mut unnamed = smart.into_iter().map(|(p, t, _)| (p, t));
        let docs = match &files.docs {
            Some(p) => (p.clone(), read(p)?),
            None => unnamed
                .next()
                .ok_or_else(|| flag("documents", "--docs FILE"))?,
        };
        let queries = match &files.queries {
            Some(p) => (p.clone(), read(p)?),
            None => unnamed
                .next()
                .ok_or_else(|| flag("queries", "--queries FILE"))?,
        };
        let (judgments_path, judgments_text) = match &files.judgments {
            Some(p) => (p.clone(), read(p)?),
            None => judgments_file
                .map(|(p, t, _)| (p, t))
                .ok_or_else(|| flag("judgments", "--judgments FILE"))?,
        };
        let (docs_path, docs_text) = docs;
        let docs: Vec<(String, String)> = records(&docs_text)
            .into_iter()
            .map(|(id, f)| (key(&id), record_text(&f)))
            .collect();
        if docs.is_empty() {
            return Err(Error::invalid(format!(
                "{}: no `.I` records (SMART format)",
                docs_path.display()
            )));
        }
        let queries: Vec<(String, String)> = records(&queries.1)
            .into_iter()
            .enumerate()
            .map(|(i, (id, f))| {
                let key = match numbering {
                    QueryNumbering::Position => (i + 1).to_string(),
                    QueryNumbering::Id => key(&id),
                };
                (key, record_text(&f))
            })
            .collect();
        let format = match files.judgments_format {
            JudgmentsFormat::Auto
                if judgments_text
                    .lines()
                    .any(|l| l.split_whitespace().count() == 4) =>
            {
                four_column_format(&judgments_text).ok_or_else(|| {
                    Error::invalid(format!(
                        "{}: four columns, but neither SMART (`query doc 0 0`) nor TREC (`query 0 doc relevance`) by their content; say which with --judgments-format",
                        judgments_path.display()
                    ))
                })?
            }
            JudgmentsFormat::Auto => JudgmentsFormat::Smart,
            other => other,
        };
        let judgments = parse_judgments(&judgments_path, &judgments_text, format, grades)?;
        Ok(Self {
            docs,
            queries,
            judgments,
        })
    }
}

/// Keys without leading zeros (`007` and `7` are one query, one document).
fn key(s: &str) -> String {
    let t = s.trim_start_matches('0');
    if t.is_empty() {
        "0".into()
    } else {
        t.to_owned()
    }
}

fn parse_judgments(
    path: &Path,
    text: &str,
    format: JudgmentsFormat,
    grades: Grades,
) -> Result<HashMap<String, HashMap<String, f64>>> {
    let mut judgments: HashMap<String, HashMap<String, f64>> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.is_empty() {
            continue;
        }
        let bad = |shape: &str| {
            Error::invalid(format!(
                "{} line {}: expected `{shape}`, got {line:?}",
                path.display(),
                n + 1
            ))
        };
        let number = |s: &str, shape: &str| s.parse::<f64>().map_err(|_| bad(shape));
        let (query, doc, gain) = match format {
            JudgmentsFormat::Trec => {
                const SHAPE: &str = "query iteration doc relevance";
                let [q, _, d, rel] = cols[..] else {
                    return Err(bad(SHAPE));
                };
                let rel = number(rel, SHAPE)?;
                // TREC: higher is more relevant; 0 or less is not relevant.
                (q, d, (rel > 0.0).then_some(rel))
            }
            _ => {
                const SHAPE: &str = "query doc [grade]";
                let (q, d) = match (cols.first(), cols.get(1)) {
                    (Some(q), Some(d)) if cols.len() <= 4 => (*q, *d),
                    _ => return Err(bad(SHAPE)),
                };
                // Four columns (CISI, CACM): the last two are placeholders; every line is a
                // relevant pair.
                let grade = match cols.len() {
                    3 => Some(number(cols[2], SHAPE)?),
                    _ => None,
                };
                let gain = match (grades, grade) {
                    (_, None) => Some(1.0),
                    (Grades::LowerIsBetter, Some(g)) if (1.0..=4.0).contains(&g) => Some(5.0 - g),
                    (Grades::HigherIsBetter, Some(g)) if g > 0.0 => Some(g),
                    _ => None,
                };
                (q, d, gain)
            }
        };
        if let Some(gain) = gain {
            judgments
                .entry(key(query))
                .or_default()
                .insert(key(doc), gain);
        }
    }
    Ok(judgments)
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

    /// A collection directory with these files.
    fn collection(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    const DOCS: &str = ".I 1\n.T\nwing flutter\n.A\nsmith\n.W\nflutter of wings at speed\n\
                        .I 2\n.T\nboundary layers\n.W\nlaminar flow\n\
                        .I 3\n.T\nheat transfer\n.W\nhot plates\n";

    fn judged(c: &Collection, query: &str) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = c.judgments[query]
            .iter()
            .map(|(d, g)| (d.clone(), *g))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[test]
    fn cranfield_three_columns_with_lower_is_better_grades() {
        let dir = collection(&[
            ("cran.all", DOCS),
            (
                "cran.qry",
                ".I 001\n.W\nwhat about flutter\n.I 002\n.W\nflow\n",
            ),
            ("cranqrel", "1 1 1\n1 3 4\n1 2 -1\n2 2 2\n"),
            // A TREC conversion beside it (sorts first): the collection's own file is taken.
            ("QRelsForTrecEval", "1 0 2 1\n"),
        ]);
        let c =
            Collection::load(dir.path(), QueryNumbering::Position, Grades::LowerIsBetter).unwrap();
        assert_eq!(c.docs.len(), 3);
        assert_eq!(
            c.docs[0],
            ("1".into(), "wing flutter\nflutter of wings at speed".into())
        );
        assert_eq!(c.queries[0], ("1".into(), "what about flutter".into()));
        assert_eq!(judged(&c, "1"), [("1".into(), 4.0), ("3".into(), 1.0)]);
        assert_eq!(judged(&c, "2"), [("2".into(), 3.0)]);
    }

    #[test]
    fn cisi_queries_with_title_and_author_fields_and_four_column_judgments() {
        // CISI.QRY: queries carry .T/.A/.W/.B — before, taken for the documents.
        let dir = collection(&[
            ("CISI.ALL", &DOCS.replace(".I 3", ".I 3\n.X\n1 5 1")),
            (
                "CISI.QRY",
                ".I 1\n.T\nFlutter question\n.A\nJones\n.W\nwings at speed\n.B\n1970\n\
                 .I 2\n.W\nlaminar\n",
            ),
            (
                "CISI.REL",
                "     1     1\t0\t0.000000\n     1     3\t0\t0.000000\n     2     2\t0\t0.000000\n",
            ),
        ]);
        let c = Collection::load(dir.path(), QueryNumbering::Id, Grades::LowerIsBetter).unwrap();
        assert_eq!(c.docs.len(), 3, "the larger .I file holds the documents");
        assert_eq!(
            c.queries[0],
            ("1".into(), "Flutter question\nwings at speed".into())
        );
        assert_eq!(judged(&c, "1"), [("1".into(), 1.0), ("3".into(), 1.0)]);
        assert_eq!(judged(&c, "2"), [("2".into(), 1.0)]);
    }

    #[test]
    fn cacm_zero_padded_ids_and_trec_qrels() {
        // CACM's qrels: `01 0001 0 0`, ids zero-padded.
        let dir = collection(&[
            ("cacm.all", DOCS),
            (
                "query.text",
                ".I 1\n.W\nflutter\n.N\n1. x\n.I 2\n.W\nflow\n.A\nsomeone\n",
            ),
            ("qrels.text", "01 0001 0 0\n01 0003 0 0\n02 0002 0 0\n"),
        ]);
        let c = Collection::load(dir.path(), QueryNumbering::Id, Grades::LowerIsBetter).unwrap();
        assert_eq!(judged(&c, "1"), [("1".into(), 1.0), ("3".into(), 1.0)]);
        assert_eq!(c.queries[1].1, "flow");
        // TREC qrels: `query 0 doc relevance`, 0 = not relevant, higher is better.
        let dir = collection(&[
            ("med.all", DOCS),
            ("med.qry", ".I 1\n.W\nflutter\n"),
            ("med.rel", "1 0 1 2\n1 0 2 0\n1 0 3 1\n"),
        ]);
        let c = Collection::load(dir.path(), QueryNumbering::Id, Grades::LowerIsBetter).unwrap();
        assert_eq!(judged(&c, "1"), [("1".into(), 2.0), ("3".into(), 1.0)]);
    }

    #[test]
    fn when_content_cannot_tell_the_error_names_the_flag_and_the_flags_decide() {
        let queries = ".I 1\n.W\nflutter\n.I 2\n.W\nflow\n.I 3\n.W\nheat\n";
        let dir = collection(&[("a", DOCS), ("b", queries), ("rels", "1 1\n2 2\n")]);
        let e = Collection::load(dir.path(), QueryNumbering::Id, Grades::LowerIsBetter)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--docs"), "{e}");
        let files = Files {
            docs: Some(dir.path().join("a")),
            queries: Some(dir.path().join("b")),
            ..Files::default()
        };
        let c = Collection::load_files(
            dir.path(),
            &files,
            QueryNumbering::Id,
            Grades::LowerIsBetter,
        )
        .unwrap();
        assert_eq!(c.queries[2].1, "heat");
        assert_eq!(c.docs[2].1, "heat transfer\nhot plates");
        // Four columns neither shape explains: refused, naming the flag; the flag reads it.
        std::fs::write(dir.path().join("rels"), "1 2 1 1\n2 3 2 0\n").unwrap();
        let e = Collection::load_files(
            dir.path(),
            &files,
            QueryNumbering::Id,
            Grades::LowerIsBetter,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--judgments-format"), "{e}");
        let trec = Files {
            judgments_format: JudgmentsFormat::Trec,
            ..files.clone()
        };
        let c =
            Collection::load_files(dir.path(), &trec, QueryNumbering::Id, Grades::LowerIsBetter)
                .unwrap();
        assert_eq!(judged(&c, "1"), [("1".into(), 1.0)]);
        assert!(!c.judgments.contains_key("2"));
        // A malformed line says where.
        std::fs::write(dir.path().join("rels"), "1 1\n1 1 x\n").unwrap();
        let named = Files {
            judgments: Some(dir.path().join("rels")),
            ..files.clone()
        };
        let e = Collection::load_files(
            dir.path(),
            &named,
            QueryNumbering::Id,
            Grades::LowerIsBetter,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 2"), "{e}");
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
