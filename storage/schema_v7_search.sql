-- Migration 7: search. The projection stays one row per message; these are
-- its indexes (docs/design.md#search). Both text indexes are language-neutral:
-- `simple` lower-cases words and never stems, so a query means the same in
-- every language, and trigrams find substrings in unsegmented scripts (Chinese,
-- Japanese, Korean), identifiers like ERR-4312 and partial words.
CREATE EXTENSION IF NOT EXISTS pg_trgm;

-- Generated, so the send statement and edits need not know about it.
ALTER TABLE scope_message_search_docs
    ADD COLUMN body_tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, body)) STORED;
CREATE INDEX scope_message_search_docs_tsv_idx ON scope_message_search_docs USING gin (body_tsv);
CREATE INDEX scope_message_search_docs_trgm_idx ON scope_message_search_docs USING gin (body gin_trgm_ops);
-- Newest-first pages and their keyset cursor.
CREATE INDEX scope_message_search_docs_recent_idx
    ON scope_message_search_docs (workspace_id, created_at, message_id);
