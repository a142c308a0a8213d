-- Migration 22: rewind (docs/rewind.md).
--
-- A recovery point (message_recovery_points, since migration 1) records who
-- prepared it. A rewind to a point is one row here: the seqs it set aside
-- (from_seq .. through_seq, still readable, marked rewound in history), who
-- rewound, the notice it wrote and how many pending deliveries it suppressed.
ALTER TABLE message_recovery_points
    ADD COLUMN created_by_member_id text REFERENCES members (id);

CREATE TABLE scope_rewinds (
    id text PRIMARY KEY CHECK (id LIKE 'rwd\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    recovery_point_id text NOT NULL REFERENCES message_recovery_points (id),
    from_seq bigint NOT NULL CHECK (from_seq >= 1),
    through_seq bigint NOT NULL,
    rewound_by_member_id text NOT NULL REFERENCES members (id),
    notice_message_id text REFERENCES scope_messages (id),
    suppressed integer NOT NULL DEFAULT 0 CHECK (suppressed >= 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (through_seq >= from_seq - 1)
);
CREATE INDEX scope_rewinds_scope_idx ON scope_rewinds (scope_id, from_seq);
