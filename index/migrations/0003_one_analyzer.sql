-- One analyzer for both backends: a row's words are analyzed in Rust (`analysis.rs`: tokens,
-- lower case, stop words, Snowball stems) and stored as they are — each distinct term, its
-- count, and the row's length as tantivy keeps it — so Postgres ranks the same words the same
-- way as the embedded backend (same BM25 over the same statistics). The tsvector goes.
ALTER TABLE index_rows
    ADD COLUMN terms text[] NOT NULL DEFAULT '{}',
    ADD COLUMN tfs   int4[] NOT NULL DEFAULT '{}',
    ADD COLUMN dl    int4   NOT NULL DEFAULT 0;
CREATE INDEX index_rows_terms ON index_rows USING gin (terms);
DROP INDEX index_rows_tsv;
ALTER TABLE index_rows DROP COLUMN search_tsv;

-- The scope's total length is now the sum of its rows' lengths (words, as stored).
ALTER TABLE index_scope_stats RENAME COLUMN lexemes TO words;

CREATE OR REPLACE FUNCTION index_scope_stats_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO index_scope_stats AS s (tenant, owner, rows, words)
        SELECT tenant, owner, count(*), sum(dl) FROM added GROUP BY tenant, owner
        ON CONFLICT (tenant, owner) DO UPDATE
        SET rows = s.rows + EXCLUDED.rows, words = s.words + EXCLUDED.words;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION index_scope_stats_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE index_scope_stats AS s SET rows = s.rows - d.n, words = s.words - d.l
        FROM (SELECT tenant, owner, count(*) AS n, sum(dl) AS l
              FROM removed GROUP BY tenant, owner) AS d
        WHERE s.tenant = d.tenant AND s.owner = d.owner;
    RETURN NULL;
END
$$;

-- Rows written before have no terms until they are written again: their conversations' marks
-- go, so the indexer (or `turnpike index rebuild`) writes them anew. Lifted for this
-- migration only, as in 0002.
ALTER TABLE index_marks NO FORCE ROW LEVEL SECURITY;
ALTER TABLE index_scope_stats NO FORCE ROW LEVEL SECURITY;
DELETE FROM index_marks;
UPDATE index_scope_stats SET words = 0;
ALTER TABLE index_marks FORCE ROW LEVEL SECURITY;
ALTER TABLE index_scope_stats FORCE ROW LEVEL SECURITY;
