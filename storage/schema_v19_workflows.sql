-- Migration 19: workflow plans (docs/workflows.md).
--
-- A plan is bound to exactly one top-level scope of type `workflow` (identity
-- `workflow:{plan_id}`), created with it in one transaction. Its transcript is
-- read only through the plan: the creator and the humans the creator shares
-- the plan with. A request is one human ask to the plan's selected agent; the
-- plan's row lock orders the single active request and its one final reply.
CREATE TABLE workflow_plans (
    id text PRIMARY KEY CHECK (id LIKE 'wfp\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL UNIQUE REFERENCES scopes (id),
    title text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    status text NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'active', 'archived')),
    creator_member_id text NOT NULL REFERENCES members (id),
    agent_member_id text NOT NULL REFERENCES members (id),
    draft text NOT NULL DEFAULT '',
    revision integer NOT NULL DEFAULT 0 CHECK (revision >= 0),
    shared_with text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_plans_creator_idx ON workflow_plans (creator_member_id);
CREATE INDEX workflow_plans_shared_idx ON workflow_plans USING gin (shared_with);

-- `final_client_message_id` is the claim a final reply takes under the plan's
-- row lock before its message is written: a second final reply finds it.
CREATE TABLE workflow_requests (
    id text PRIMARY KEY CHECK (id LIKE 'wfr\_%'),
    plan_id text NOT NULL REFERENCES workflow_plans (id),
    requester_member_id text NOT NULL REFERENCES members (id),
    client_message_id text NOT NULL,
    message_id text REFERENCES scope_messages (id),
    seq bigint,
    status text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'answered', 'superseded', 'failed')),
    final_client_message_id text,
    final_message_id text REFERENCES scope_messages (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (plan_id, requester_member_id, client_message_id)
);
-- At most one request of a plan holds the agent's wake.
CREATE UNIQUE INDEX workflow_requests_active_idx ON workflow_requests (plan_id)
    WHERE status = 'active';
