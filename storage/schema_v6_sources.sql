-- Explicit context: who a recipient_context row opens its source message to.
-- The readable predicate looks the viewer up by (context_member_id,
-- source_message_id); every other kind of source row names nobody.
ALTER TABLE scope_message_sources ADD COLUMN context_member_id text REFERENCES members (id);
ALTER TABLE scope_message_sources ADD CONSTRAINT scope_message_sources_context_member_check
    CHECK ((source_kind = 'recipient_context') = (context_member_id IS NOT NULL));
CREATE INDEX scope_message_sources_context_idx
    ON scope_message_sources (context_member_id, source_message_id)
    WHERE context_member_id IS NOT NULL;
