-- Migration 2: default channels. New humans and public agents of a workspace
-- join its default channels when they are created (`scopenode admin
-- create-member`). Only public channels qualify: a default must never let a
-- newcomer into a channel it could not join by itself.
ALTER TABLE scope_channel_profiles
    ADD COLUMN is_default boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT scope_channel_profiles_default_public
        CHECK (NOT is_default OR visibility = 'public');

-- Workspaces created before defaults existed keep working: their public
-- #general becomes the default.
UPDATE scope_channel_profiles SET is_default = true
WHERE slug = 'general' AND visibility = 'public';
