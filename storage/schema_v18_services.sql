-- Migration 18: service accounts.
--
-- A service account is a member of type `service` with one `service_account`
-- scope (identity `service_account:{workspace}:{member}`), whose audience is
-- every active human of the workspace. Its managers are the humans an admin
-- lets post as the service; nothing a member does over the protocol adds one.
CREATE TABLE service_managers (
    service_member_id text NOT NULL REFERENCES members (id),
    manager_member_id text NOT NULL REFERENCES members (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (service_member_id, manager_member_id),
    CHECK (service_member_id <> manager_member_id)
);
CREATE INDEX service_managers_manager_idx ON service_managers (manager_member_id);
