-- Tasks (docs/tasks.md): a top-level scope of type 'task' with a title, a
-- status, its creator, the channel it came from (if any) and its assignees.
-- The task's members are ordinary scope memberships: the creator and every
-- assignee (a private agent as a private member of its owner).
CREATE TABLE scope_task_profiles (
    scope_id text PRIMARY KEY REFERENCES scopes (id),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    title text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    description text NOT NULL DEFAULT '',
    status text NOT NULL DEFAULT 'open'
        CHECK (status IN ('open', 'in_progress', 'blocked', 'done', 'cancelled')),
    creator_member_id text NOT NULL REFERENCES members (id),
    channel_scope_id text REFERENCES scopes (id),
    assignee_ids text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX scope_task_profiles_creator_idx ON scope_task_profiles (creator_member_id);
CREATE INDEX scope_task_profiles_assignees_idx ON scope_task_profiles USING gin (assignee_ids);
CREATE INDEX scope_task_profiles_channel_idx ON scope_task_profiles (channel_scope_id)
    WHERE channel_scope_id IS NOT NULL;
