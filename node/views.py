"""Domain values → protocol views."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from actors.cards import APP_KEY, SHARE_KEY, public_card
from actors.model import Member, StoredMessage
from actors.planner import MessagePlan
from actors.ports import CommittedSend
from actors.sources import VIEW_KIND
from protocol.frames import AuthorView, Deliver, MemberView, MessageView
from storage.applier import message_metadata
from storage.sources import pending
from storage.tasks import Assignment


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


def sees_recipients(viewer_id: str | None, author_id: str, recipients: Collection[str]) -> bool:
    """``metadata.recipients`` is for the author and the recipients only."""
    return viewer_id is not None and (viewer_id == author_id or viewer_id in recipients)


# The manager who posted a service's message (docs/services.md): readers see
# the service as the author; the service and its managers (as they were when
# it was posted: ``managers``) see who it was.
AUTHORISED_BY = "authorisedBy"
MANAGERS = "managers"
_PRIVATE_METADATA = frozenset({"recipients", AUTHORISED_BY, MANAGERS})


def privileged_readers(author_id: str, metadata: Mapping[str, Any]) -> frozenset[str] | None:
    """Who is shown a message's private metadata (``recipients``,
    ``authorisedBy``): the author and those it names; None when it has none."""
    recipients = metadata.get("recipients") or ()
    authoriser = metadata.get(AUTHORISED_BY)
    if not recipients and authoriser is None:
        return None
    return frozenset({author_id, *recipients, *_authorisers(metadata)})


def _authorisers(metadata: Mapping[str, Any]) -> list[str]:
    """The posting manager and the service's managers at the time."""
    authoriser = metadata.get(AUTHORISED_BY)
    return [authoriser, *(metadata.get(MANAGERS) or ())] if authoriser else []


def stored_message_view(message: StoredMessage, viewer_id: str | None) -> MessageView:
    """The message as ``viewer_id`` may see it (None: a reader with no special standing)."""
    metadata = _shown_metadata(message, viewer_id)
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
        sources=run_sources(metadata),
        attachments=attachment_views(message.metadata),
        mentions=list(message.mentions),
        revision=message.revision,
        edited_at=rfc3339(message.edited_at) if message.edited_at is not None else None,
        deleted=message.deleted_at is not None,
        card=public_card(message) or msgspec.UNSET,
    )


def _shown_metadata(message: StoredMessage, viewer_id: str | None) -> dict[str, Any]:
    """The metadata ``viewer_id`` is shown: without what is shown as fields of
    its own, and private keys only to those they are for."""
    metadata = {k: v for k, v in message.metadata.items() if k not in _NOT_METADATA}
    recipients = metadata.get("recipients")
    if recipients is not None and not sees_recipients(viewer_id, message.author.id, recipients):
        del metadata["recipients"]
    if AUTHORISED_BY in metadata and viewer_id not in (
        message.author.id,
        *_authorisers(metadata),
    ):
        metadata.pop(AUTHORISED_BY)
        metadata.pop(MANAGERS, None)
    return metadata


def run_sources(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What caused a scheduled message (docs/schedules.md): its ``schedule_run``
    ref, shown first among its ``sources``; the cited messages follow."""
    source = metadata.get("source")
    if isinstance(source, dict) and source.get("kind") == "schedule_run":
        return [dict(source)]
    return []


# Stored with the message but shown as fields of their own (or not at all).
_NOT_METADATA = frozenset({"mentions", "attachmentIds", "attachments", SHARE_KEY, APP_KEY})
ATTACHMENT_URL = "/v1/attachments/{}"


def attachment_views(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``attachments`` of a message: what the send stored of each upload it
    claimed (``metadata.attachments``), with its download path. Only the row
    that carries ``attachmentIds`` shows them (a chunked send's first row)."""
    ids = metadata.get("attachmentIds")
    if not ids:
        return []
    return [
        {**found, "url": ATTACHMENT_URL.format(found["id"])}
        for found in metadata.get("attachments", ())
        if isinstance(found, dict) and found.get("id") in ids
    ]


def committed_message_view(plan: MessagePlan, commit: CommittedSend) -> MessageView:
    """The view of a message just committed, as its author sees it: the same shape
    history returns (see :func:`without_recipients` for everyone else)."""
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
    view = stored_message_view(stored, plan.author.id)
    # One encoding serves every reader, so no source is checked per reader
    # here: each is ``pending`` until the reader reads the message through
    # history (docs/design.md#sources).
    view.sources += [
        pending(VIEW_KIND[s.kind]) for s in intent.sources if s.context_member_id is None
    ]
    return view


def without_recipients(view: MessageView) -> MessageView:
    """The view for a reader that is neither the author nor named by the
    message's private metadata (a recipient, the authorising manager)."""
    metadata = {k: v for k, v in view.metadata.items() if k not in _PRIVATE_METADATA}
    return msgspec.structs.replace(view, metadata=metadata)


def task_wake(
    activity_id: str, agent_id: str, found: Assignment, reason: str
) -> tuple[str, Deliver]:
    """The ``deliver`` of a task assignment, with its delivery id: the task as a
    card (no stored message; docs/tasks.md)."""
    task = found.task
    # Named like a message wake (``dlv_<ref>.<agent>``): ``ack`` finds it by its activity id.
    wake_id = f"dlv_{activity_id}.{agent_id.removeprefix('mem_')}"
    actor = found.actor
    card = MessageView(
        id=activity_id,
        scope_id=task.id,
        seq=task.latest_seq,
        global_seq=0,
        author=AuthorView(
            member_id=actor.id,
            type=actor.type.value,
            handle=actor.handle,
            display_name=actor.display_name,
        ),
        message_type="task_assignment",
        content=task.title,
        created_at=rfc3339(found.at),
        metadata={"taskId": task.id, "status": task.status, "description": task.description},
    )
    event = Deliver(
        delivery_id=wake_id,
        agent_id=agent_id,
        target_key=task.id,
        target_seq=task.latest_seq,
        reason=reason,
        message=card,
        task_id=task.id,
    )
    return wake_id, event
