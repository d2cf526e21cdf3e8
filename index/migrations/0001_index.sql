-- The hybrid index: one row per indexed item. No content: the text is kept only as a tsvector
-- and an embedding; hits are hydrated from the reference.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE index_rows (
    tenant       text     NOT NULL,
    owner        text     NOT NULL,
    id           text     NOT NULL,
    app          text     NOT NULL,
    agent        text     NOT NULL,
    conversation text     NOT NULL,
    turn         bigint   NOT NULL,
    kind         text     NOT NULL,
    reference    text     NOT NULL,
    at_ms        bigint   NOT NULL,
    -- No fixed dimension here: each embedder's dimension gets its own partial HNSW index
    -- (created at open), so changing embedders needs no migration.
    embedding    vector   NOT NULL,
    search_tsv   tsvector NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE INDEX index_rows_tsv ON index_rows USING gin (search_tsv);
CREATE INDEX index_rows_scope ON index_rows (tenant, owner, at_ms);
CREATE INDEX index_rows_conversation ON index_rows (tenant, owner, conversation);

-- How far each conversation is indexed (the last turn whose rows are all written).
CREATE TABLE index_marks (
    tenant       text   NOT NULL,
    owner        text   NOT NULL,
    conversation text   NOT NULL,
    turn         bigint NOT NULL,
    PRIMARY KEY (tenant, conversation)
);

-- The second wall: a session sees and writes only the rows of the identity it is bound to
-- (`turnpike.tenant`, `turnpike.identity`, set per transaction), whatever its queries say.
-- FORCE makes the policies bind the tables' owner too; queries run as `turnpike_scoped`, which
-- is neither owner nor superuser.
ALTER TABLE index_rows ENABLE ROW LEVEL SECURITY;
ALTER TABLE index_rows FORCE ROW LEVEL SECURITY;
CREATE POLICY index_rows_scope ON index_rows
    USING (tenant = current_setting('turnpike.tenant', true)
           AND owner = current_setting('turnpike.identity', true))
    WITH CHECK (tenant = current_setting('turnpike.tenant', true)
                AND owner = current_setting('turnpike.identity', true));

ALTER TABLE index_marks ENABLE ROW LEVEL SECURITY;
ALTER TABLE index_marks FORCE ROW LEVEL SECURITY;
CREATE POLICY index_marks_scope ON index_marks
    USING (tenant = current_setting('turnpike.tenant', true)
           AND owner = current_setting('turnpike.identity', true))
    WITH CHECK (tenant = current_setting('turnpike.tenant', true)
                AND owner = current_setting('turnpike.identity', true));

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'turnpike_scoped') THEN
        CREATE ROLE turnpike_scoped NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE ON index_rows, index_marks TO turnpike_scoped;
GRANT turnpike_scoped TO CURRENT_USER;
