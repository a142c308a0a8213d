-- scopenode schema, version 1. Every table and column has a stated meaning
-- (docs/schema.md). Applied by storage/schema.py; verify compares the live
-- catalog with a scratch copy built from these same statements.

CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE workspaces (
    id text PRIMARY KEY CHECK (id LIKE 'ws\_%'),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Workspace global seqs come from one sequence: unique and increasing in
-- allocation order within every workspace, with gaps (a rolled-back send
-- burns its number). A per-workspace counter row would serialise every commit
-- of a workspace on one row lock.
CREATE SEQUENCE message_global_seq AS bigint;

CREATE TABLE members (
    id text PRIMARY KEY CHECK (id LIKE 'mem\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    type text NOT NULL CHECK (type IN ('human', 'agent', 'service')),
    handle text NOT NULL CHECK (handle ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    display_name text NOT NULL,
    owner_member_id text REFERENCES members (id),
    is_private boolean NOT NULL DEFAULT false,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'deactivated')),
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, handle),
    CHECK (NOT is_private OR (type = 'agent' AND owner_member_id IS NOT NULL))
);
CREATE INDEX members_owner_idx ON members (owner_member_id) WHERE owner_member_id IS NOT NULL;

CREATE TABLE credentials (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    member_id text NOT NULL REFERENCES members (id),
    token_hash bytea NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX credentials_member_idx ON credentials (member_id);

CREATE TABLE scopes (
    id text PRIMARY KEY CHECK (id LIKE 'scp\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    type text NOT NULL CHECK (type IN ('channel', 'dm', 'thread', 'task', 'service_account', 'workflow')),
    parent_scope_id text REFERENCES scopes (id),
    root_message_id text,
    root_message_short_id text,
    identity_key text UNIQUE,
    latest_seq bigint NOT NULL DEFAULT 0 CHECK (latest_seq >= 0),
    latest_global_seq bigint NOT NULL DEFAULT 0 CHECK (latest_global_seq >= 0),
    latest_message_at timestamptz,
    roster_generation bigint NOT NULL DEFAULT 0 CHECK (roster_generation >= 0),
    archived_until_seq bigint,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    created_by_member_id text REFERENCES members (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    archived_at timestamptz,
    CHECK ((type = 'thread') = (parent_scope_id IS NOT NULL)),
    CHECK ((type = 'thread') = (root_message_id IS NOT NULL)),
    CHECK (type NOT IN ('dm', 'service_account', 'workflow') OR identity_key IS NOT NULL)
);
CREATE INDEX scopes_workspace_idx ON scopes (workspace_id, type);
CREATE UNIQUE INDEX scopes_thread_root_idx ON scopes (parent_scope_id, root_message_id)
    WHERE type = 'thread';

CREATE TABLE scope_channel_profiles (
    scope_id text PRIMARY KEY REFERENCES scopes (id),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    slug text NOT NULL CHECK (slug ~ '^[a-z0-9][a-z0-9_-]{0,79}$'),
    display_name text NOT NULL,
    description text NOT NULL DEFAULT '',
    visibility text NOT NULL CHECK (visibility IN ('public', 'private')),
    owner_member_id text NOT NULL REFERENCES members (id),
    is_all_channel boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, slug)
);

CREATE TABLE scope_memberships (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope_id text NOT NULL REFERENCES scopes (id),
    member_id text NOT NULL REFERENCES members (id),
    visibility text NOT NULL CHECK (visibility IN ('public', 'private')),
    owner_member_id text REFERENCES members (id),
    last_read_seq bigint NOT NULL DEFAULT 0 CHECK (last_read_seq >= 0),
    last_read_global_seq bigint NOT NULL DEFAULT 0 CHECK (last_read_global_seq >= 0),
    owner_context_dismissed_through_global_seq bigint NOT NULL DEFAULT 0,
    effective_from_seq bigint NOT NULL CHECK (effective_from_seq >= 1),
    effective_to_seq bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    removed_at timestamptz,
    archived_at timestamptz,
    CHECK ((visibility = 'private') = (owner_member_id IS NOT NULL)),
    CHECK (effective_to_seq IS NULL OR effective_to_seq >= effective_from_seq),
    -- at most one effective membership per (scope, member) at any seq
    EXCLUDE USING gist (
        scope_id WITH =,
        member_id WITH =,
        int8range(effective_from_seq, effective_to_seq) WITH &&
    )
);
CREATE UNIQUE INDEX scope_memberships_current_idx ON scope_memberships (scope_id, member_id)
    WHERE effective_to_seq IS NULL;
CREATE INDEX scope_memberships_member_idx ON scope_memberships (member_id, scope_id);

CREATE TABLE scope_notification_settings (
    scope_id text NOT NULL REFERENCES scopes (id),
    member_id text NOT NULL REFERENCES members (id),
    state text NOT NULL CHECK (state IN ('active', 'quiet', 'mute', 'auto-wake', 'no-wake')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope_id, member_id)
);

CREATE TABLE scope_private_grants (
    id text PRIMARY KEY CHECK (id LIKE 'grt\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    owner_member_id text NOT NULL REFERENCES members (id),
    grantee_member_id text NOT NULL REFERENCES members (id),
    granted_by_member_id text NOT NULL REFERENCES members (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    revoked_at timestamptz,
    CHECK (grantee_member_id <> owner_member_id),
    CHECK (expires_at IS NULL OR expires_at > created_at)
);
CREATE INDEX scope_private_grants_scope_idx ON scope_private_grants (scope_id, owner_member_id);

CREATE TABLE scope_messages (
    id text PRIMARY KEY CHECK (id LIKE 'msg\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    seq bigint NOT NULL CHECK (seq >= 1),
    workspace_global_seq bigint NOT NULL CHECK (workspace_global_seq >= 1),
    author_member_id text NOT NULL REFERENCES members (id),
    author_type text NOT NULL CHECK (author_type IN ('human', 'agent', 'service')),
    notify_principal_member_id text NOT NULL REFERENCES members (id),
    idempotency_subject_member_id text NOT NULL REFERENCES members (id),
    client_message_id text,
    idempotency_payload_digest bytea,
    message_type text NOT NULL,
    content text NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (scope_id, seq),
    UNIQUE (workspace_id, workspace_global_seq),
    CHECK ((client_message_id IS NULL) = (idempotency_payload_digest IS NULL))
);
CREATE UNIQUE INDEX scope_messages_idempotency_idx ON scope_messages
    (scope_id, author_member_id, idempotency_subject_member_id, client_message_id)
    WHERE client_message_id IS NOT NULL;
CREATE INDEX scope_messages_author_idx ON scope_messages (scope_id, author_member_id, seq);

ALTER TABLE scopes ADD CONSTRAINT scopes_root_message_fk
    FOREIGN KEY (root_message_id) REFERENCES scope_messages (id);

CREATE TABLE scope_message_sources (
    target_scope_id text NOT NULL REFERENCES scopes (id),
    message_id text NOT NULL REFERENCES scope_messages (id),
    ordinal integer NOT NULL CHECK (ordinal >= 0),
    source_scope_id text NOT NULL REFERENCES scopes (id),
    source_seq bigint NOT NULL,
    source_message_id text NOT NULL REFERENCES scope_messages (id),
    source_kind text NOT NULL CHECK (source_kind IN ('quote', 'single_forward', 'multi_forward', 'explicit_context', 'recipient_context')),
    source_dedupe_key text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, ordinal),
    UNIQUE (message_id, source_dedupe_key)
);
CREATE INDEX scope_message_sources_source_idx ON scope_message_sources (source_message_id);

CREATE TABLE scope_activity_events (
    id text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    activity_type text NOT NULL CHECK (activity_type IN ('reaction_add', 'task_activity', 'share_activity', 'attachment_activity')),
    activity_ref_type text NOT NULL,
    activity_ref_id text NOT NULL,
    activity_global_seq bigint NOT NULL,
    source_message_id text REFERENCES scope_messages (id),
    actor_member_id text NOT NULL REFERENCES members (id),
    reason text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    suppressed_at timestamptz
);
CREATE INDEX scope_activity_events_scope_idx ON scope_activity_events (scope_id, activity_global_seq);
CREATE INDEX scope_activity_events_ref_idx ON scope_activity_events (activity_ref_type, activity_ref_id);

CREATE TABLE scope_fanout_outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    message_id text REFERENCES scope_messages (id),
    event_ref_type text NOT NULL CHECK (event_ref_type IN ('message', 'activity', 'mutation')),
    event_ref_id text NOT NULL,
    fanout_type text NOT NULL CHECK (fanout_type IN ('realtime', 'agent_wake', 'mutation')),
    delivery_policy text NOT NULL CHECK (delivery_policy IN ('inline_ordinary', 'autonomous_store_recoverable', 'inline_targeted', 'worker_first_targeted', 'worker_first_mutation')),
    target_member_id text REFERENCES members (id),
    target_seq bigint,
    dedupe_key text NOT NULL UNIQUE,
    payload jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'leased', 'delivered', 'failed', 'suppressed')),
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts integer NOT NULL DEFAULT 8 CHECK (max_attempts >= 1),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_owner text,
    lease_expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    suppressed_at timestamptz,
    suppression_reason text,
    last_error text,
    CHECK ((status = 'leased') = (lease_owner IS NOT NULL))
);
CREATE INDEX scope_fanout_outbox_due_idx ON scope_fanout_outbox (next_attempt_at)
    WHERE status IN ('pending', 'leased');
CREATE INDEX scope_fanout_outbox_target_idx ON scope_fanout_outbox (target_member_id, target_seq)
    WHERE fanout_type = 'agent_wake' AND status IN ('pending', 'leased');
CREATE INDEX scope_fanout_outbox_done_idx ON scope_fanout_outbox (created_at)
    WHERE status IN ('delivered', 'suppressed', 'failed');

CREATE TABLE attachments (
    id text PRIMARY KEY CHECK (id LIKE 'att\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text REFERENCES scopes (id),
    message_id text REFERENCES scope_messages (id),
    uploaded_by_member_id text NOT NULL REFERENCES members (id),
    storage_driver text NOT NULL CHECK (storage_driver IN ('local', 'database')),
    storage_object_key text NOT NULL,
    filename text NOT NULL,
    content_type text NOT NULL,
    byte_size bigint NOT NULL CHECK (byte_size >= 0),
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (message_id IS NULL OR scope_id IS NOT NULL)
);
CREATE INDEX attachments_message_idx ON attachments (message_id) WHERE message_id IS NOT NULL;

CREATE TABLE scope_message_reactions (
    scope_id text NOT NULL REFERENCES scopes (id),
    message_id text NOT NULL REFERENCES scope_messages (id),
    member_id text NOT NULL REFERENCES members (id),
    emoji text NOT NULL CHECK (length(emoji) BETWEEN 1 AND 64),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, member_id, emoji)
);

CREATE TABLE message_recovery_points (
    id text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    message_id text NOT NULL REFERENCES scope_messages (id),
    strategy text NOT NULL CHECK (strategy IN ('truncate_after', 'snapshot')),
    recovery_ref text NOT NULL DEFAULT '',
    prepared_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    UNIQUE (message_id)
);

CREATE TABLE scope_message_search_docs (
    message_id text PRIMARY KEY REFERENCES scope_messages (id),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    seq bigint NOT NULL,
    author_member_id text NOT NULL REFERENCES members (id),
    body text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX scope_message_search_docs_scope_idx ON scope_message_search_docs (scope_id, seq);

CREATE TABLE scope_message_search_state (
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_key text NOT NULL DEFAULT '*',
    migration_state text NOT NULL DEFAULT 'complete' CHECK (migration_state IN ('pending', 'running', 'complete')),
    backfill_state text NOT NULL DEFAULT 'complete' CHECK (backfill_state IN ('pending', 'running', 'complete')),
    finalize_state text NOT NULL DEFAULT 'complete' CHECK (finalize_state IN ('pending', 'running', 'complete')),
    read_ready boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, scope_key),
    CHECK (NOT read_ready OR (migration_state = 'complete' AND backfill_state = 'complete' AND finalize_state = 'complete'))
);

CREATE TABLE scope_share_cards (
    id text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text NOT NULL REFERENCES scopes (id),
    message_id text NOT NULL UNIQUE REFERENCES scope_messages (id),
    source_scope_id text NOT NULL REFERENCES scopes (id),
    source_message_id text REFERENCES scope_messages (id),
    target_scope_id text NOT NULL REFERENCES scopes (id),
    created_by_member_id text NOT NULL REFERENCES members (id),
    revoked_at timestamptz,
    revoked_by_member_id text REFERENCES members (id),
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((revoked_at IS NULL) = (revoked_by_member_id IS NULL))
);

CREATE TABLE service_notification_cards (
    scope_id text NOT NULL REFERENCES scopes (id),
    message_id text PRIMARY KEY REFERENCES scope_messages (id),
    app_notification_id text NOT NULL,
    schema_version integer NOT NULL CHECK (schema_version >= 1),
    card_revision integer NOT NULL DEFAULT 1 CHECK (card_revision >= 1),
    render_payload_json jsonb NOT NULL,
    action_schema_json jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'completed', 'expired', 'cancelled')),
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE moderation_audit_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces (id),
    scope_id text REFERENCES scopes (id),
    target text NOT NULL,
    human_member_id text NOT NULL REFERENCES members (id),
    author_member_id text NOT NULL REFERENCES members (id),
    content text NOT NULL,
    matched_keywords text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX moderation_audit_log_created_idx ON moderation_audit_log (created_at);
