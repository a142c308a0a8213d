"""The incoming-webhook body of ``POST /v1/services/<handle>/messages``
(docs/services.md#incoming-webhooks): ours, or Slack's incoming-webhook
payload converted to our Markdown. Pure: no I/O.

Ours is ``{"content", "clientMessageId"?, "target"?}``. A body without
``content`` but with ``text`` or ``blocks`` is read as Slack's: ``text`` (the
fallback Slack shows where blocks cannot be drawn) or, without it, the text
of the blocks; Slack's other fields (``username``, ``icon_emoji``,
``channel``, attachments' colours) are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.text import TextKind, text_problem

MAX_CONTENT = 40_000
MAX_CLIENT_MESSAGE_ID = 200
MAX_TARGET = 256
# <url|label>, <url>, <@U123|name>, <#C123|name>, <!here>: Slack's link syntax.
_ANGLE = re.compile(r"<([^<>\n]+)>")
# Slack's emphasis: a single marker hugging a word run on one line.
_BOLD = re.compile(r"(?<![*\w])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![*\w])")
_ITALIC = re.compile(r"(?<![_\w])_(?=\S)([^_\n]+?)(?<=\S)_(?![_\w])")
_STRIKE = re.compile(r"(?<![~\w])~(?=\S)([^~\n]+?)(?<=\S)~(?![~\w])")
_FENCE = re.compile(r"(```.*?```|`[^`\n]*`)", re.S)
_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))


class PayloadError(Exception):
    """A body the endpoint refuses: ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True, slots=True)
class WebhookPost:
    content: str
    client_message_id: str | None
    target: str | None
    slack: bool


def parse(body: object) -> WebhookPost:
    """The post a decoded JSON body asks for, or :class:`PayloadError`."""
    if not isinstance(body, dict):
        raise PayloadError("$", "the body must be a JSON object")
    client_message_id = _optional(body, "clientMessageId", MAX_CLIENT_MESSAGE_ID, TextKind.KEY)
    target = _optional(body, "target", MAX_TARGET, TextKind.KEY)
    if "content" in body:
        content = _string(body, "content")
        slack = False
    elif "text" in body or "blocks" in body:
        content = slack_content(body)
        slack = True
    else:
        raise PayloadError("$.content", "required (or Slack's text or blocks)")
    if not content.strip():
        raise PayloadError("$.text" if slack else "$.content", "must not be empty")
    if len(content) > MAX_CONTENT:
        raise PayloadError("$.content", f"at most {MAX_CONTENT} characters")
    if (problem := text_problem(content, TextKind.CONTENT)) is not None:
        raise PayloadError("$.text" if slack else "$.content", problem)
    return WebhookPost(content, client_message_id, target, slack)


def _string(body: dict[str, Any], key: str) -> str:
    value = body[key]
    if not isinstance(value, str):
        raise PayloadError(f"$.{key}", "must be a string")
    return value


def _optional(body: dict[str, Any], key: str, limit: int, kind: TextKind) -> str | None:
    if body.get(key) is None:
        return None
    value = _string(body, key)
    if not 1 <= len(value) <= limit:
        raise PayloadError(f"$.{key}", f"1 to {limit} characters")
    if (problem := text_problem(value, kind)) is not None:
        raise PayloadError(f"$.{key}", problem)
    return value


def slack_content(body: dict[str, Any]) -> str:
    """Slack's ``text`` (else its blocks' text) in our Markdown."""
    if body.get("text") is not None:
        return slack_markdown(_string(body, "text"))
    blocks = body.get("blocks")
    if not isinstance(blocks, list):
        raise PayloadError("$.blocks", "must be a list of blocks")
    return slack_markdown("\n".join(filter(None, (_block_text(b) for b in blocks))))


def _block_text(block: object) -> str:
    """A block's text: a section's text and fields, a header's, a context's elements."""
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    parts: list[str] = []
    if kind == "header":
        text = _text_object(block.get("text"))
        return f"*{text}*" if text else ""
    if kind == "divider":
        return "---"
    parts.append(_text_object(block.get("text")))
    for key in ("fields", "elements"):
        items = block.get(key)
        if isinstance(items, list):
            parts.extend(_text_object(item) for item in items)
    return "\n".join(part for part in parts if part)


def _text_object(value: object) -> str:
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    return ""


def slack_markdown(text: str) -> str:
    """Slack's mrkdwn in our Markdown: ``<url|label>`` → ``[label](url)``,
    ``*bold*`` → ``**bold**``, ``_italic_`` → ``*italic*``, ``~strike~`` →
    ``~~strike~~``, ``<!here>`` → ``@here``, ``<@U1|ann>`` → ``@ann``,
    ``<#C1|ops>`` → ``#ops``; code spans and fences are kept as they are."""
    pieces = _FENCE.split(text)
    return "".join(
        _unescape(piece) if index % 2 else _inline(piece) for index, piece in enumerate(pieces)
    )


def _inline(text: str) -> str:
    # Emphasis first: a link's label keeps its own markers, converted once.
    for pattern, convert in _EMPHASIS:
        text = pattern.sub(convert, text)
    return _unescape(_ANGLE.sub(_link, text))


_EMPHASIS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (_BOLD, lambda m: f"**{m[1]}**"),
    (_ITALIC, lambda m: f"*{m[1]}*"),
    (_STRIKE, lambda m: f"~~{m[1]}~~"),
)


def _link(match: re.Match[str]) -> str:
    inner = match[1]
    target, _, label = inner.partition("|")
    if target.startswith("!"):
        # <!here>, <!channel>, <!everyone>, <!subteam^ID|@team>: a word for everyone.
        return label or "@" + target[1:].split("^", 1)[0]
    if target.startswith("@"):
        return "@" + (label or target[1:]).lstrip("@")
    if target.startswith("#"):
        return "#" + (label or target[1:]).lstrip("#")
    if label:
        return f"[{label}]({target})"
    return target


def _unescape(text: str) -> str:
    for entity, char in _ENTITIES:
        text = text.replace(entity, char)
    return text
