"""Domain values → protocol views."""

from __future__ import annotations

from datetime import UTC, datetime

from actors.model import Member, StoredMessage
from actors.planner import MessagePlan
from actors.ports import CommittedSend
from protocol.frames import AuthorView, MemberView, MessageView
from storage.applier import message_metadata


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def author_view(member: Member) -> AuthorView:
    return AuthorView(
        member_id=member.id,
        type=member.type.value,
        handle=member.handle,
        display_name=member.display_name,
    )


def member_view(member: Member) -> MemberView:
    return MemberView(
        id=member.id, type=member.type.value, handle=member.handle, display_name=member.display_name
    )


def stored_message_view(message: StoredMessage) -> MessageView:
    metadata = {k: v for k, v in message.metadata.items() if k not in ("mentions", "attachmentIds")}
    return MessageView(
        id=message.id,
        scope_id=message.scope_id,
        seq=message.seq,
        global_seq=message.global_seq,
        author=author_view(message.author),
        message_type=message.message_type,
        content=message.content,
        created_at=rfc3339(message.created_at),
        metadata=metadata,
        mentions=list(message.mentions),
    )


def committed_message_view(plan: MessagePlan, commit: CommittedSend) -> MessageView:
    """The view of a message just committed: the same shape history returns."""
    intent = plan.intent
    stored = StoredMessage(
        id=commit.message_id,
        scope_id=intent.scope_id,
        seq=commit.seq,
        global_seq=commit.global_seq,
        author=plan.author,
        message_type=intent.message_type,
        content=intent.content,
        created_at=commit.created_at,
        metadata=message_metadata(plan),
        mentions=plan.mentions,
    )
    return stored_message_view(stored)
