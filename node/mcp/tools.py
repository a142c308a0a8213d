"""The MCP tools: what a model may do as the agent, described for a model.

Each tool is a name, a description, a JSON schema for its arguments and a
handler that answers ``(text, structured)``. Inputs are checked here against
the schema's types before anything reaches the node; what the node refuses
comes back as :class:`~node.mcp.agent.ToolFailure` with its code and message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from node.client import ClientError
from node.mcp import render
from node.mcp.agent import Agent, Sent, ToolFailure

Answer = tuple[str, dict[str, Any]]
Handler = Callable[[Agent, dict[str, Any]], Awaitable[Answer]]

MAX_WAIT_S = 600
MAX_READ = 200
DEFAULT_READ = 20

CONVERSATION = {
    "type": "string",
    "description": "'#channel', '@handle' for your direct messages with them, or a "
    "conversation id from list_conversations",
}
MESSAGE_ID = {"type": "string", "description": "a message id, as read_messages shows it (msg_…)"}


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    handler: Handler


def object_schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def required(args: dict[str, Any], name: str) -> str:
    """The string argument ``name``, which must be there and not blank."""
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolFailure(
            "validation_failed", f"{name} must be a non-empty string", {"path": f"$.{name}"}
        )
    return value


def optional(args: dict[str, Any], name: str) -> str | None:
    """The string argument ``name``, or None when it is left out (or empty)."""
    if args.get(name) in (None, ""):
        return None
    return required(args, name)


def int_arg(args: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    """The whole-number argument ``name`` (``default`` when left out), within bounds."""
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ToolFailure(
            "validation_failed",
            f"{name} must be a number from {low} to {high}",
            {"path": f"$.{name}"},
        )
    return int(value)


async def node_call(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    try:
        return await call
    except ClientError as exc:
        raise ToolFailure.of(exc) from None


# --- conversations and messages --------------------------------------------------------


async def list_conversations(agent: Agent, args: dict[str, Any]) -> Answer:
    found = await agent.directory.conversations()
    lines = [
        f"{c.name} ({c.type}{', ' + c.title if c.title != c.name.lstrip('#@') else ''}) "
        f"id {c.scope_id} · {c.unread} unread"
        for c in found
    ]
    text = "\n".join(lines) if lines else "You are in no conversation yet."
    return text, {"conversations": [c.as_dict() for c in found]}


async def read_messages(agent: Agent, args: dict[str, Any]) -> Answer:
    conversation = required(args, "conversation")
    since = None if args.get("since") is None else int_arg(args, "since", 0, 0, 2**63 - 1)
    limit = int_arg(args, "limit", DEFAULT_READ, 1, MAX_READ)
    page = await agent.read(conversation, since, limit)
    shown = list(page.get("messages") or [])
    more = (
        f" (more after these: read again with since={page.get('coversThroughSeq')})"
        if page.get("hasMore") and since is not None
        else ""
    )
    text = f"{page['conversation']} (id {page.get('scopeId')}), latest seq {page.get('latestSeq')}{more}:\n"
    text += render.messages_text(shown)
    return text, {
        "conversation": page["conversation"],
        "conversationId": page.get("scopeId"),
        "latestSeq": page.get("latestSeq"),
        "coversThroughSeq": page.get("coversThroughSeq"),
        "hasMore": bool(page.get("hasMore")),
        "messages": [render.message_fields(m) for m in shown],
    }


def _sent_answer(sent: Sent) -> Answer:
    structured: dict[str, Any] = {"state": sent.state, "conversation": sent.conversation}
    if sent.stored:
        structured |= {
            "messageId": sent.result.get("messageId"),
            "seq": sent.result.get("acceptedSeq"),
            "wakesAcknowledged": sent.acked,
        }
        text = f"Sent to {sent.conversation} as {sent.result.get('messageId')} (seq {sent.result.get('acceptedSeq')})."
        if sent.state == "already_sent":
            text = f"Already sent earlier to {sent.conversation} as {sent.result.get('messageId')}: not stored twice."
        if sent.acked:
            text += f" Wake {', '.join(sent.acked)} is done."
        return text, structured
    structured["missed"] = [render.message_fields(m) for m in sent.missed]
    count = len(sent.missed)
    stored = (
        " Part of it was stored already; send the same text again to finish it."
        if sent.state == "partial_held"
        else " Nothing was stored."
    )
    text = (
        f"Not sent: {count} new message{'s' if count != 1 else ''} arrived in "
        f"{sent.conversation} since you last read — here they are; send again if your "
        f"reply still stands.{stored}\n{render.messages_text(sent.missed)}"
    )
    return text, structured


async def send_message(agent: Agent, args: dict[str, Any]) -> Answer:
    conversation = required(args, "conversation")
    text = required(args, "text")
    sent = await agent.send(
        conversation, text, reply_to=optional(args, "reply_to"), thread=optional(args, "thread")
    )
    return _sent_answer(sent)


async def wait_for_attention(agent: Agent, args: dict[str, Any]) -> Answer:
    timeout = int_arg(args, "timeout_s", 60, 0, MAX_WAIT_S)
    wake = await agent.wait(timeout)
    if wake is None:
        return f"Nothing needed you in the last {timeout} s.", {"wake": None}
    delivery = wake.delivery
    text = (
        f"Wake {delivery.delivery_id}: {render.why(delivery, wake.conversation)}.\n"
        f"{render.message_line(delivery.message)}\n\n"
        f"Latest in {wake.conversation}:\n{render.messages_text(wake.context)}\n\n"
        f"Answer with send_message(conversation={wake.conversation!r}, ...), or call "
        f"dismiss(wake_id={delivery.delivery_id!r}) if there is nothing to say."
    )
    fields = render.wake_fields(delivery, wake.conversation)
    fields["recent"] = [render.message_fields(m) for m in wake.context]
    return text, {"wake": fields}


async def dismiss(agent: Agent, args: dict[str, Any]) -> Answer:
    done = await agent.dismiss(optional(args, "wake_id"))
    ids = [d.delivery_id for d in done]
    text = f"Dismissed {', '.join(ids)}." if ids else "No wake was open."
    return text, {"dismissed": ids}


async def react(agent: Agent, args: dict[str, Any]) -> Answer:
    message_id = required(args, "message_id")
    emoji = required(args, "emoji")
    op = "remove" if args.get("remove") is True else "add"
    result = await node_call(agent.client.react(message_id, emoji, op))
    changed = bool(result.get("changed"))
    verb = "Added" if op == "add" else "Removed"
    text = f"{verb} {emoji} on {message_id}." if changed else "Nothing changed."
    return text, {"changed": changed}


async def search(agent: Agent, args: dict[str, Any]) -> Answer:
    query = required(args, "query")
    conversation = optional(args, "conversation")
    filters: dict[str, Any] = {}
    if conversation:
        if conversation.startswith(("#", "@")):
            filters["in_scope"] = conversation
        else:
            filters["scope_id"] = conversation.removeprefix("scope:")
    page = await node_call(agent.client.search(query, limit=20, **filters))
    hits = page.get("hits") or []
    lines = [
        f"{agent.directory.name_of(str(h.get('scopeId')))} {render.message_line(h['message'])}"
        for h in hits
    ]
    text = "\n".join(lines) if lines else f"Nothing found for {query!r}."
    return text, {
        "hits": [
            {"conversationId": h.get("scopeId"), **render.message_fields(h["message"])}
            for h in hits
        ]
    }


async def edit_message(agent: Agent, args: dict[str, Any]) -> Answer:
    message_id = required(args, "message_id")
    text = required(args, "text")
    result = await node_call(agent.client.edit(message_id, text))
    return f"Edited {message_id} (revision {result.get('revision')}).", result


async def delete_message(agent: Agent, args: dict[str, Any]) -> Answer:
    message_id = required(args, "message_id")
    await node_call(agent.client.delete(message_id))
    return f"Deleted {message_id}: a tombstone stays in its place.", {"deleted": message_id}


async def explain(agent: Agent, args: dict[str, Any]) -> Answer:
    message_id = required(args, "message_id")
    delivery = agent.explain(message_id)
    if delivery is None:
        text = f"No wake about {message_id} reached you through this server."
        return text, {"wake": None}
    where = agent.directory.name_of(delivery.target_key)
    state = "still open" if delivery.delivery_id in agent.open_wakes else "done"
    text = f"You were woken because {render.why(delivery, where)}; wake {delivery.delivery_id} is {state}."
    return text, {"wake": render.wake_fields(delivery, where) | {"open": state == "still open"}}
