-- Migration 13: emoji and pictographs as search terms. pg_trgm takes only
-- letters and digits, so a search for `🚀` had no index and read every
-- document of the viewer's scopes (a quarter of a second at 60,000 messages,
-- growing with them). This index holds each document's distinct characters
-- of the symbol and emoji blocks below; a term made of such characters is
-- found through it and checked with ILIKE. Text without them costs one regex
-- test and indexes nothing.
CREATE FUNCTION scopenode_symbols(body text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN body !~ '[\u2190-\u2bff\U0001f000-\U0001faff]'
        THEN '{}'::text[]
        ELSE ARRAY(
            SELECT DISTINCT m[1]
            FROM regexp_matches(body, '([\u2190-\u2bff\U0001f000-\U0001faff])', 'g') AS m)
    END
$$;
CREATE INDEX scope_message_search_docs_symbols_idx
    ON scope_message_search_docs USING gin (scopenode_symbols(body))
    WITH (gin_pending_list_limit = 512)
    WHERE body ~ '[\u2190-\u2bff\U0001f000-\U0001faff]';
