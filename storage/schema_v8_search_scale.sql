-- Migration 8: search at scale. A search starts from the viewer's scopes
-- (its memberships); the statement is prepared and runs with a generic plan,
-- which cannot see which member it is for. This index answers that lookup from
-- the index alone, so the generic plan takes it and never the membership
-- exclusion constraint's GiST index (on scope_id first: a scan of all of it).
CREATE INDEX scope_memberships_viewer_idx ON scope_memberships (member_id)
    INCLUDE (scope_id, visibility, effective_to_seq);
