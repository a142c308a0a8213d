-- Migration 11: no index leads with (scope_id, author_member_id) but the
-- unique idempotency index. The other one, (scope_id, author_member_id, seq),
-- served no query, cost every send an index entry, and on a table whose
-- statistics lag behind its growth (a new deployment, a busy scope between
-- two analyses) the planner took it for the clientMessageId probe every send
-- makes: a scan of everything the author had written in the scope.
DROP INDEX scope_messages_author_idx;
