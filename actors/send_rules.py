"""What a client may set on a ``send``: the checks that need no database. Pure.

The node owns some fields of a message: its type beyond plain text and the
chunk suffix of a ``clientMessageId``. A client that sets them, or names an
attachment id that cannot be an upload, is refused with ``validation_failed``
and the offending path before its send reaches the scope actor. Server paths that own another
type (none yet besides the node's own chunk rows) build their commands
themselves and are not checked here.

Checks that need the database live next to them: recipients, forward
sources and attachments (the sender's own unclaimed uploads) in
``node/ops/messages.py`` (looked up only when the send has them),
a private agent recipient's authority in the actor (``ScopeState.decide``,
against the grants it caches).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime

from actors.model import Member, MemberType
from actors.policy import private_authority
from actors.visibility import VisibilityContext
from protocol.errors import ErrorCode, OperationError

# Chunk i of a logical send with clientMessageId C is stored under ``C#i``
# (``actors/scope_state.py`` builds it with this separator).
CHUNK_SUFFIX = "#"

# Message types a member may set, by member type. Services are held to the
# same rule as people and agents: a type other than ``text`` belongs to the
# server path that produces it (a card, a system notice), never to a request.
CLIENT_MESSAGE_TYPES: Mapping[MemberType, frozenset[str]] = {
    MemberType.HUMAN: frozenset({"text"}),
    MemberType.AGENT: frozenset({"text"}),
    MemberType.SERVICE: frozenset({"text"}),
}

# ``#<digits>`` at the end is reserved whatever the chunk separator is, so a
# later change of separator cannot reopen a collision with stored rows.
_RESERVED_SUFFIX = re.compile(rf"(?:#|{re.escape(CHUNK_SUFFIX)})\d+$")

# The prefix of a message id (``actors.ids.new_id("msg")``).
MESSAGE_ID_PREFIX = "msg_"
# The prefix of an upload's id (``actors.ids.new_id("att")``).
ATTACHMENT_ID_PREFIX = "att_"


def _invalid(message: str, path: str) -> OperationError:
    return OperationError(ErrorCode.VALIDATION_FAILED, message, path=path)


def message_type_error(author: Member, message_type: str) -> OperationError | None:
    allowed = CLIENT_MESSAGE_TYPES.get(author.type, frozenset())
    if message_type in allowed:
        return None
    return _invalid(
        f"messageType {message_type!r} is set by the server, not by a {author.type.value}",
        "$.messageType",
    )


def client_message_id_error(client_message_id: str) -> OperationError | None:
    # Most ids have neither character: skip the regex on the hot path.
    if "#" not in client_message_id and CHUNK_SUFFIX not in client_message_id:
        return None
    if _RESERVED_SUFFIX.search(client_message_id) is None:
        return None
    return _invalid(
        "a clientMessageId may not end in '#<digits>': that suffix names the rows "
        "of a chunked send",
        "$.clientMessageId",
    )


def attachment_error(attachment_ids: Sequence[str]) -> OperationError | None:
    """An id that cannot name an upload, or one named twice (never looked up).

    Whether each id is one of the sender's own unclaimed uploads is checked
    against the database in ``node/ops/messages.py``.
    """
    seen: set[str] = set()
    for index, attachment_id in enumerate(attachment_ids):
        if not attachment_id.startswith(ATTACHMENT_ID_PREFIX) or attachment_id in seen:
            return _invalid("no such upload", f"$.attachmentIds[{index}]")
        seen.add(attachment_id)
    return None


def source_id_error(index: int, message_id: str) -> OperationError | None:
    """A forward source that cannot be a message id at all (never looked up)."""
    if message_id.startswith(MESSAGE_ID_PREFIX) and len(message_id) > len(MESSAGE_ID_PREFIX):
        return None
    return _invalid("not a message id", f"$.forward.sources[{index}].messageId")


def check_send_fields(
    author: Member,
    *,
    message_type: str,
    client_message_id: str,
    attachment_ids: Sequence[str],
    source_ids: Sequence[str] = (),
) -> None:
    """Raise the first field a client may not set like this (``validation_failed``)."""
    error = (
        message_type_error(author, message_type)
        or client_message_id_error(client_message_id)
        or attachment_error(attachment_ids)
    )
    if error is None:
        for index, source_id in enumerate(source_ids):
            error = source_id_error(index, source_id)
            if error is not None:
                break
    if error is not None:
        raise error


def recipient_errors(
    author: Member, recipients: Sequence[str], found: Mapping[str, Member]
) -> OperationError | None:
    """Every recipient must be a member of the author's workspace.

    ``found`` holds the members looked up by id; one of another workspace is
    reported exactly like an unknown id, so the answer reveals nothing about
    other workspaces.
    """
    for index, member_id in enumerate(recipients):
        member = found.get(member_id)
        if member is None or member.workspace_id != author.workspace_id:
            return _invalid("no such member in this workspace", f"$.recipients[{index}]")
    return None


def recipient_authority_error(
    ctx: VisibilityContext, author: Member, recipients: Sequence[Member], at: datetime
) -> OperationError | None:
    """Addressing a private agent needs the author's private authority over it."""
    for index, recipient in enumerate(recipients):
        if recipient.is_private_agent and not private_authority(ctx, author, recipient, at):
            return OperationError(
                ErrorCode.FORBIDDEN,
                "no authority to address this private agent",
                path=f"$.recipients[{index}]",
            )
    return None
