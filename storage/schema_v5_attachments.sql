-- Uploads (docs/design.md#attachments). A send reserves the uploads it names
-- before it reaches its scope's actor, so a second send of the same uploads
-- is refused instead of being stored without them; the send's statement then
-- claims them (message_id, scope_id). Deleting a message releases its
-- uploads: unreadable at once, removed by the sweeper.
ALTER TABLE attachments
    ADD COLUMN claim_key text,
    ADD COLUMN claim_reserved_at timestamptz,
    ADD COLUMN released_at timestamptz,
    ADD CONSTRAINT attachments_claim_reservation_check
        CHECK ((claim_key IS NULL) = (claim_reserved_at IS NULL));

-- The sweeper's scans: unclaimed uploads oldest first, and released ones.
CREATE INDEX attachments_unclaimed_idx ON attachments (created_at) WHERE message_id IS NULL;
CREATE INDEX attachments_released_idx ON attachments (released_at) WHERE released_at IS NOT NULL;
-- Bytes are shared by content: a blob goes only when no row names it any more.
CREATE INDEX attachments_object_idx ON attachments (storage_driver, storage_object_key);
