-- Migration 9: two-character substrings of unsegmented scripts. Chinese and
-- Japanese words are often two characters, and pg_trgm extracts no trigram
-- from a two-character pattern, so `body ILIKE '%自不%'` had no index and a
-- search read every document of the viewer's scopes. The index holds each
-- document's distinct adjacent pairs of CJK ideographs, kana and Hangul (the
-- character ranges below); a two-character term is found through it and
-- checked with ILIKE. Text without those characters costs one regex test and
-- indexes nothing.
CREATE FUNCTION scopenode_cjk_bigrams(body text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN body !~ '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]'
        THEN '{}'::text[]
        ELSE ARRAY(
            SELECT DISTINCT substr(body, i, 2)
            FROM generate_series(1, char_length(body) - 1) AS i
            WHERE substr(body, i, 2)
                ~ '^[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]{2}$')
    END
$$;
CREATE INDEX scope_message_search_docs_cjk_idx
    ON scope_message_search_docs USING gin (scopenode_cjk_bigrams(body));
