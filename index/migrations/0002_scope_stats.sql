-- Per-scope statistics for BM25: how many rows an identity has and their total length (distinct
-- lexemes), kept exact by statement-level triggers in the same transaction as every write, so a
-- search reads them instead of scanning the identity's rows.
CREATE TABLE index_scope_stats (
    tenant  text   NOT NULL,
    owner   text   NOT NULL,
    rows    bigint NOT NULL,
    lexemes bigint NOT NULL,
    PRIMARY KEY (tenant, owner)
);

-- The same wall as the rows': a session sees and writes only its own identity's statistics.
-- The triggers run as the writer (not SECURITY DEFINER), so the policy binds them too.
ALTER TABLE index_scope_stats ENABLE ROW LEVEL SECURITY;
ALTER TABLE index_scope_stats FORCE ROW LEVEL SECURITY;
CREATE POLICY index_scope_stats_scope ON index_scope_stats
    USING (tenant = current_setting('turnpike.tenant', true)
           AND owner = current_setting('turnpike.identity', true))
    WITH CHECK (tenant = current_setting('turnpike.tenant', true)
                AND owner = current_setting('turnpike.identity', true));
GRANT SELECT, INSERT, UPDATE, DELETE ON index_scope_stats TO turnpike_scoped;

CREATE FUNCTION index_scope_stats_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO index_scope_stats AS s (tenant, owner, rows, lexemes)
        SELECT tenant, owner, count(*), sum(length(search_tsv)) FROM added GROUP BY tenant, owner
        ON CONFLICT (tenant, owner) DO UPDATE
        SET rows = s.rows + EXCLUDED.rows, lexemes = s.lexemes + EXCLUDED.lexemes;
    RETURN NULL;
END
$$;

CREATE FUNCTION index_scope_stats_remove() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE index_scope_stats AS s SET rows = s.rows - d.n, lexemes = s.lexemes - d.l
        FROM (SELECT tenant, owner, count(*) AS n, sum(length(search_tsv)) AS l
              FROM removed GROUP BY tenant, owner) AS d
        WHERE s.tenant = d.tenant AND s.owner = d.owner;
    RETURN NULL;
END
$$;

CREATE TRIGGER index_rows_stats_insert AFTER INSERT ON index_rows
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION index_scope_stats_add();
CREATE TRIGGER index_rows_stats_update_old AFTER UPDATE ON index_rows
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION index_scope_stats_remove();
CREATE TRIGGER index_rows_stats_update_new AFTER UPDATE ON index_rows
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION index_scope_stats_add();
CREATE TRIGGER index_rows_stats_delete AFTER DELETE ON index_rows
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION index_scope_stats_remove();

-- The rows already there. The policies bind the tables' owner too (FORCE), and a migration has
-- no scope: lifted for the backfill only, inside this migration's transaction.
ALTER TABLE index_rows NO FORCE ROW LEVEL SECURITY;
ALTER TABLE index_scope_stats NO FORCE ROW LEVEL SECURITY;
INSERT INTO index_scope_stats (tenant, owner, rows, lexemes)
    SELECT tenant, owner, count(*), sum(length(search_tsv)) FROM index_rows GROUP BY tenant, owner;
ALTER TABLE index_rows FORCE ROW LEVEL SECURITY;
ALTER TABLE index_scope_stats FORCE ROW LEVEL SECURITY;

-- Large batches are staged in a temporary table, created by `turnpike_scoped`: a database
-- hardened by revoking TEMPORARY from PUBLIC still lets it (when this user may grant it).
DO $$
BEGIN
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO turnpike_scoped', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'turnpike_scoped keeps the TEMPORARY privilege PUBLIC has';
END
$$;
