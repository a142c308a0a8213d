-- Migration 20: schedules (docs/schedules.md).
--
-- A schedule posts its content into a target scope at each occurrence of its
-- rule, as the workspace's schedule service, with its human owner as the
-- authorisation principal. ``next_at`` is the one occurrence still to fire
-- (NULL once a one-off has fired); the scheduler claims due rows with
-- FOR UPDATE SKIP LOCKED and advances ``next_at`` in the transaction that
-- holds the claim.
CREATE TABLE schedule_services (
    workspace_id text PRIMARY KEY REFERENCES workspaces (id),
    member_id text NOT NULL UNIQUE REFERENCES members (id)
);

CREATE TABLE schedules (
    id text PRIMARY KEY CHECK (id LIKE 'sch\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    owner_member_id text NOT NULL REFERENCES members (id),
    target_scope_id text NOT NULL REFERENCES scopes (id),
    content text NOT NULL,
    at timestamptz,
    rule jsonb,
    time_zone text NOT NULL,
    starts_at timestamptz NOT NULL DEFAULT now(),
    next_at timestamptz,
    paused boolean NOT NULL DEFAULT false,
    fired integer NOT NULL DEFAULT 0,
    last_run jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((at IS NULL) <> (rule IS NULL))
);
CREATE INDEX schedules_due_idx ON schedules (next_at) WHERE next_at IS NOT NULL AND NOT paused;
CREATE INDEX schedules_owner_idx ON schedules (owner_member_id, created_at);
