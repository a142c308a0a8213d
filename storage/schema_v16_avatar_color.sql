-- Migration 16: a member's avatar colour (docs/design.md#profiles).
--
-- One of a fixed palette, so a client draws it from its own stylesheet and no
-- member-chosen value ever reaches a style; NULL lets the client pick one from
-- the member id.
ALTER TABLE members
    ADD COLUMN avatar_color text
        CHECK (avatar_color IN ('blue', 'green', 'orange', 'purple', 'red', 'teal', 'pink', 'gray'));
