"""Messages and wakes as compact text for a model, and as structured content.

Every tool answers twice: a few lines a model reads well, and the same facts
as JSON for a client that wants fields. Both come from here.
"""

from __future__ import annotations

from typing import Any

from node.client import Delivery

REASONS = {
    "mention": "{author} mentioned you",
    "explicit_recipient": "{author} named you as a recipient",
    "auto_wake": "you are on auto-wake there, so every message wakes you",
    "dm": "{author} wrote to you in a direct message",
    "task_assigned": "you were assigned a task",
}


def author_of(message: dict[str, Any]) -> str:
    author = message.get("author") or {}
    handle = author.get("handle") if isinstance(author, dict) else None
    return f"@{handle}" if handle else "someone"


def message_line(message: dict[str, Any]) -> str:
    """``[seq 12 · msg_… · 2026-12-05T08:00:00Z] @ann: text`` (and its thread, if any)."""
    head = f"[seq {message.get('seq')} · {message.get('id')} · {message.get('createdAt', '')}]"
    body = "(deleted)" if message.get("deleted") else str(message.get("content", ""))
    if message.get("editedAt"):
        body += " (edited)"
    line = f"{head} {author_of(message)}: {body}"
    thread = message.get("thread")
    if isinstance(thread, dict):
        line += f"\n    ↳ thread: {thread.get('replyCount', 0)} replies (read it as its id {thread.get('scopeId')})"
    reactions = message.get("reactions")
    if reactions:
        line += "\n    reactions: " + " ".join(
            f"{r.get('emoji')}×{r.get('count', 1)}" for r in reactions if isinstance(r, dict)
        )
    return line


def message_fields(message: dict[str, Any]) -> dict[str, Any]:
    """The fields of a message a model needs, for structured content."""
    fields: dict[str, Any] = {
        "id": message.get("id"),
        "seq": message.get("seq"),
        "author": author_of(message),
        "time": message.get("createdAt"),
        "text": "" if message.get("deleted") else message.get("content", ""),
    }
    if message.get("deleted"):
        fields["deleted"] = True
    if isinstance(message.get("thread"), dict):
        thread = message["thread"]
        fields["thread"] = {"id": thread.get("scopeId"), "replies": thread.get("replyCount")}
    return fields


def messages_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(message_line(m) for m in messages) if messages else "(no messages)"


def why(delivery: Delivery, where: str) -> str:
    """Why the agent was woken, in one sentence."""
    reason = REASONS.get(delivery.reason, "you were woken ({reason})")
    said = reason.format(author=author_of(delivery.message), reason=delivery.reason)
    return f"{said} in {where} (message {delivery.message_id}, seq {delivery.target_seq})"


def wake_fields(delivery: Delivery, where: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "wakeId": delivery.delivery_id,
        "reason": delivery.reason,
        "conversation": where,
        "conversationId": delivery.target_key,
        "message": message_fields(delivery.message),
    }
    if delivery.task_id is not None:
        fields["taskId"] = delivery.task_id
    if delivery.request_id is not None:
        fields["workflow"] = {"planId": delivery.plan_id, "requestId": delivery.request_id}
    return fields
