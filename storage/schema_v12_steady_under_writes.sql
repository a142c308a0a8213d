-- Migration 12: the tables every send writes stay healthy while a team keeps
-- writing. A GIN index takes new rows into a pending list that every search
-- through it reads in full until VACUUM (or an insert that finds the list
-- over its limit) merges it: a smaller list and a vacuum every thousand
-- inserts keep that read short and the merge an insert pays small. The
-- defaults (vacuum after a fifth of the table is new, analyse after a tenth)
-- wait longer the larger the table grows; these do not.
ALTER INDEX scope_message_search_docs_tsv_idx SET (gin_pending_list_limit = 512);
ALTER INDEX scope_message_search_docs_trgm_idx SET (gin_pending_list_limit = 512);
ALTER INDEX scope_message_search_docs_cjk_idx SET (gin_pending_list_limit = 512);
ALTER TABLE scope_message_search_docs SET (
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE scope_messages SET (
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
-- Every wake is inserted, leased, marked delivered and pruned: mostly dead rows.
ALTER TABLE scope_fanout_outbox SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.05
);
