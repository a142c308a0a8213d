-- Migration 14: lookups whose cost grew with the tables a team keeps writing.
--
-- A (scope, member) lookup reads a btree, not the exclusion constraint's
-- GiST. The planner costed both alike for `scope_id = ? AND member_id = ?`
-- and took the GiST, whose text-key pages overlap more the more memberships
-- there are (every thread adds some). Keyed on one expression the constraint
-- still keeps each (scope, member)'s intervals disjoint, but no lookup by the
-- two columns can use it.
ALTER TABLE scope_memberships
    DROP CONSTRAINT scope_memberships_scope_id_member_id_int8range_excl;
ALTER TABLE scope_memberships
    ADD CONSTRAINT scope_memberships_intervals_disjoint EXCLUDE USING gist (
        (scope_id || '/' || member_id) WITH =,
        int8range(effective_from_seq, effective_to_seq) WITH &&
    );
-- Every row of one scope (ended intervals too), in member order.
CREATE INDEX scope_memberships_scope_idx ON scope_memberships (scope_id, member_id);

-- An edit or delete suppresses the message's pending deliveries and its
-- activity, and a relaying node reads the wakes of the messages it relays:
-- without these each read the whole outbox (tens of thousands of rows after
-- half an hour of a busy team) inside the scope's serialised write path.
CREATE INDEX scope_fanout_outbox_message_idx ON scope_fanout_outbox (message_id)
    WHERE message_id IS NOT NULL;
CREATE INDEX scope_activity_events_source_idx ON scope_activity_events (source_message_id)
    WHERE source_message_id IS NOT NULL AND suppressed_at IS NULL;
