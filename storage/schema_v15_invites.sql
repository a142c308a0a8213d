-- Migration 15: workspace roles and invite links.
--
-- An admin is a human member the operator trusts with the workspace; nothing
-- a member does over the protocol makes one (`scopenode admin promote`).
ALTER TABLE members
    ADD COLUMN is_admin boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT members_admin_human CHECK (NOT is_admin OR type = 'human');

-- A link that lets a person create their own human member. Only the code's
-- hash is kept, as with credentials: a leaked table holds no usable link.
-- `uses` is claimed in the transaction that creates the member, so a link
-- with N uses never makes N + 1 members.
CREATE TABLE workspace_invites (
    id text PRIMARY KEY CHECK (id LIKE 'inv\_%'),
    workspace_id text NOT NULL REFERENCES workspaces (id),
    code_hash bytea NOT NULL UNIQUE,
    join_scope_ids text[] NOT NULL DEFAULT '{}',
    max_uses integer CHECK (max_uses > 0),
    uses integer NOT NULL DEFAULT 0 CHECK (uses >= 0 AND (max_uses IS NULL OR uses <= max_uses)),
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workspace_invites_workspace_idx ON workspace_invites (workspace_id);

-- Where the nodes on this database said their web client is, so that an
-- admin command run beside them (with no node flags) can print a link that
-- opens it.
CREATE TABLE node_web_origins (
    origin text PRIMARY KEY,
    node_id text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);
