-- Migration 21: cards (docs/cards.md).
--
-- `scope_share_cards` and `service_notification_cards` come from migration 1.
-- Each human action on an app card is a fact of its own: taken on one
-- revision of the card, so the primary key makes a second action on the same
-- revision impossible even if two nodes raced past the card's row lock.
CREATE TABLE service_card_actions (
    message_id text NOT NULL REFERENCES service_notification_cards (message_id),
    revision integer NOT NULL CHECK (revision >= 1),
    action_id text NOT NULL,
    value text NOT NULL DEFAULT '',
    member_id text NOT NULL REFERENCES members (id),
    service_member_id text NOT NULL REFERENCES members (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, revision)
);
