-- Migration 10: the index of CJK pairs holds only the documents that contain
-- such characters. Every other document added an empty entry to it (GIN keeps
-- one for an empty array), paid for by every send; a search for a CJK pair
-- states the same condition, so the partial index still finds its candidates.
-- The pattern must stay the text `storage.search.CJK_CHARACTER` uses.
DROP INDEX scope_message_search_docs_cjk_idx;
CREATE INDEX scope_message_search_docs_cjk_idx
    ON scope_message_search_docs USING gin (scopenode_cjk_bigrams(body))
    WHERE body ~ '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]';
