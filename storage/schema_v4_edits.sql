-- Migration 4: edits and deletes. A message keeps its id and seq for life; an
-- edit bumps its revision and keeps the replaced content in a revision row, a
-- delete leaves a tombstone (empty content) in its place, so seqs, read state
-- and thread roots never move.
ALTER TABLE scope_messages
    ADD COLUMN revision integer NOT NULL DEFAULT 0,
    ADD COLUMN edited_at timestamptz,
    ADD COLUMN deleted_at timestamptz,
    ADD COLUMN deleted_by_member_id text REFERENCES members (id),
    ADD CONSTRAINT scope_messages_revision_nonnegative CHECK (revision >= 0),
    ADD CONSTRAINT scope_messages_deleted_by CHECK ((deleted_at IS NULL) = (deleted_by_member_id IS NULL));

CREATE TABLE scope_message_revisions (
    message_id text NOT NULL REFERENCES scope_messages (id),
    revision integer NOT NULL CHECK (revision >= 0),
    scope_id text NOT NULL REFERENCES scopes (id),
    content text NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}',
    edited_by_member_id text NOT NULL REFERENCES members (id),
    replaced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, revision)
);
