"""Cards from the client's side (docs/cards.md): sharing a channel or a
message, revoking a share, and a service's interactive cards. Mixed into
:class:`node.client.connection.Client`; every method is one request."""

from __future__ import annotations

import uuid
from typing import Any


class CardRequests:
    async def request(self, op: str, /, **fields: Any) -> dict[str, Any]:
        raise NotImplementedError  # Client's

    async def share_channel(self, channel_id: str, target: str) -> dict[str, Any]:
        """``shareChannel``: ``{cardId, messageId, seq}``."""
        return await self.request("shareChannel", channelId=channel_id, target=target)

    async def share_message(self, message_id: str, target: str) -> dict[str, Any]:
        """``shareMessage``: ``{cardId, messageId, seq}``."""
        return await self.request("shareMessage", messageId=message_id, target=target)

    async def revoke_share(self, card_id: str) -> dict[str, Any]:
        """``revokeShare``: the card's creator or the shared channel's owner."""
        return await self.request("revokeShare", cardId=card_id)

    async def post_card(
        self,
        target: str,
        fallback: str,
        card: dict[str, Any],
        *,
        client_message_id: str | None = None,
        expires_at: str | None = None,
    ) -> dict[str, Any]:
        """``postCard`` (a service's session): ``{messageId, seq, revision: 1}``;
        ``card`` is ``{title, text?, fields?, actions?}``."""
        fields: dict[str, Any] = {
            "target": target,
            "fallback": fallback,
            "card": card,
            "clientMessageId": client_message_id or f"c-{uuid.uuid4().hex}",
        }
        if expires_at is not None:
            fields["expiresAt"] = expires_at
        return await self.request("postCard", **fields)

    async def card_action(
        self, message_id: str, action_id: str, revision: int, value: str = ""
    ) -> int:
        """``cardAction``: the card's revision after it (``conflict`` raises)."""
        result = await self.request(
            "cardAction", messageId=message_id, actionId=action_id, revision=revision, value=value
        )
        return int(result["revision"])

    async def update_card(
        self, message_id: str, revision: int, card: dict[str, Any], *, fallback: str | None = None
    ) -> int:
        """``updateCard`` (the posting service): the card's new revision."""
        fields: dict[str, Any] = {"messageId": message_id, "revision": revision, "card": card}
        if fallback is not None:
            fields["fallback"] = fallback
        result = await self.request("updateCard", **fields)
        return int(result["revision"])
