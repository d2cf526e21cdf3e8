//! One analyzer and one BM25 for both backends: a query ranks the same words the same way
//! wherever it runs.
//!
//! - **Analysis**: words are runs of letters and digits (tantivy's simple tokenizer), longer
//!   than [`MAX_WORD`] bytes dropped, lower-cased, English stop words (Lucene's 33) dropped, then
//!   stemmed (Snowball English). At most [`MAX_TEXT`] bytes of a row's text are analyzed.
//! - **A row's length** is its count of analyzed words, rounded down as tantivy stores it (one
//!   byte: exact to 40, coarser above — [`stored_length`]); the average length is over the
//!   caller's own rows.
//! - **BM25**: k1 = 1.2, b = 0.75, idf = ln(1 + (N − n + 0.5)/(n + 0.5)) with N the caller's rows
//!   and n those holding the term; a query word said twice counts twice.
//! - **Query syntax** (the same on both): `"a phrase"` — its words are required (each of them,
//!   anywhere in the row) and ranked; `-word` — rows with the word are left out; anything else —
//!   ranked words, any of them. Filters, required and excluded words never change a score or
//!   the statistics.
//!
//! The embedded backend registers [`analyzer`] as the tokenizer of its text field; the Postgres
//! backend stores each row's analyzed terms, their counts and its length (from [`analyze`]), and
//! computes the same formula in SQL.

use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};

/// The tokenizer name the embedded index registers [`analyzer`] under.
pub const TOKENIZER: &str = "turnpike_en";

/// Bytes of a row's text analyzed (the rest is not searchable by words).
pub const MAX_TEXT: usize = 64 * 1024;

/// The longest word kept, in bytes (longer ones are dropped, as tantivy's default does).
pub const MAX_WORD: usize = 40;

/// The most distinct terms a query ranks by (the rest of a very long query is ignored).
pub const MAX_QUERY_TERMS: usize = 256;

/// BM25's term-frequency saturation and length normalisation (tantivy's and Lucene's).
pub const K1: f64 = 1.2;
pub const B: f64 = 0.75;

/// The analyzer: simple tokenizer, long words dropped, lower-cased, English stop words
/// dropped, Snowball English stems.
pub fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(MAX_WORD))
        .filter(LowerCaser)
        .filter(StopWordFilter::new(Language::English).expect("tantivy ships English stop words"))
        .filter(Stemmer::new(Language::English))
        .build()
}

/// The first [`MAX_TEXT`] bytes of `text` (cut at a character boundary).
pub fn truncated(text: &str) -> &str {
    if text.len() <= MAX_TEXT {
        return text;
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The analyzed terms of `text`, in order (with repeats).
pub fn terms(text: &str) -> Vec<String> {
    let mut analyzer = analyzer();
    let mut stream = analyzer.token_stream(text);
    let mut out = Vec::new();
    while let Some(token) = stream.next() {
        out.push(token.text.clone());
    }
    out
}

/// A row's text as BM25 sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Analyzed {
    /// Each distinct term with its count, sorted by term.
    pub terms: Vec<(String, u32)>,
    /// The count of analyzed words.
    pub length: u32,
}

/// Analyzes a row's text (its first [`MAX_TEXT`] bytes).
pub fn analyze(text: &str) -> Analyzed {
    let all = terms(truncated(text));
    let length = u32::try_from(all.len()).unwrap_or(u32::MAX);
    Analyzed {
        terms: counted(all),
        length,
    }
}

fn counted(mut all: Vec<String>) -> Vec<(String, u32)> {
    all.sort_unstable();
    let mut out: Vec<(String, u32)> = Vec::new();
    for term in all {
        match out.last_mut() {
            Some((last, n)) if *last == term => *n += 1,
            _ => out.push((term, 1)),
        }
    }
    out
}

/// A length as tantivy keeps it (one byte per row): exact up to 40 words, rounded down to a
/// coarser step above. Both backends normalise by this.
pub fn stored_length(length: u32) -> u32 {
    tantivy::fieldnorm::FieldNormReader::id_to_fieldnorm(
        tantivy::fieldnorm::FieldNormReader::fieldnorm_to_id(length),
    )
}

/// A query, read with the syntax above.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// Ranked terms with how often the query says them, sorted by term.
    pub ranked: Vec<(String, u32)>,
    /// Terms every hit must hold (a quoted phrase's).
    pub required: Vec<String>,
    /// Terms no hit may hold.
    pub excluded: Vec<String>,
}

impl Query {
    /// Reads `text` (see the module's doc for the syntax).
    pub fn parse(text: &str) -> Query {
        let mut ranked = Vec::new();
        let mut required = Vec::new();
        let mut excluded = Vec::new();
        for (i, part) in text.split('"').enumerate() {
            // Odd parts were inside quotes (an unclosed quote runs to the end).
            if i % 2 == 1 {
                let words = terms(part);
                required.extend(words.iter().cloned());
                ranked.extend(words);
                continue;
            }
            for word in part.split_whitespace() {
                match word.strip_prefix('-') {
                    Some(rest) if rest.chars().next().is_some_and(char::is_alphanumeric) => {
                        excluded.extend(terms(rest))
                    }
                    _ => ranked.extend(terms(word)),
                }
            }
        }
        let mut ranked = counted(ranked);
        ranked.retain(|(t, _)| !excluded.contains(t));
        ranked.truncate(MAX_QUERY_TERMS);
        for list in [&mut required, &mut excluded] {
            list.sort_unstable();
            list.dedup();
            list.truncate(MAX_QUERY_TERMS);
        }
        Query {
            ranked,
            required,
            excluded,
        }
    }

    /// Whether nothing is ranked (no hit then).
    pub fn is_empty(&self) -> bool {
        self.ranked.is_empty()
    }
}

/// BM25's inverse document frequency of a term held by `n` of `rows` rows.
pub fn idf(rows: f64, n: f64) -> f64 {
    (1.0 + (rows - n + 0.5) / (n + 0.5)).ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_split_lowered_stopped_and_stemmed() {
        assert_eq!(
            terms("The XJ-9000 shipped; shipping THE parts to Zürich!"),
            ["xj", "9000", "ship", "ship", "part", "zürich"]
        );
        assert!(terms(&"a".repeat(41)).is_empty(), "long words are dropped");
        let a = analyze("Flows flow, and the flow flowed.");
        assert_eq!(a.terms, [("flow".to_owned(), 4)]);
        assert_eq!(a.length, 4);
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let text = "é".repeat(MAX_TEXT);
        let cut = truncated(&text);
        assert!(cut.len() <= MAX_TEXT && cut.len() > MAX_TEXT - 2);
    }

    #[test]
    fn stored_lengths_are_exact_to_forty_and_round_down_above() {
        for n in 0..=40 {
            assert_eq!(stored_length(n), n);
        }
        assert!(stored_length(174) <= 174 && stored_length(174) > 150);
        assert!(stored_length(1000) <= 1000);
    }

    #[test]
    fn queries_read_phrases_exclusions_and_repeats() {
        let q = Query::parse("flow flows \"boundary layer\" -heat - shock OR wave");
        assert_eq!(
            q.ranked,
            [
                ("boundari".to_owned(), 1),
                ("flow".to_owned(), 2),
                ("layer".to_owned(), 1),
                ("shock".to_owned(), 1),
                ("wave".to_owned(), 1)
            ]
        );
        assert_eq!(q.required, ["boundari", "layer"]);
        assert_eq!(q.excluded, ["heat"]);
        assert!(Query::parse("the of and").is_empty());
        // An unclosed quote runs to the end; a lone dash is no exclusion.
        let q = Query::parse("\"open ended - quote");
        assert_eq!(q.required, ["end", "open", "quot"]);
        assert!(q.excluded.is_empty());
    }
}
