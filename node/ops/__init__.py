"""Request handlers other than ``send``, by domain; each returns the reply's ``result``.

``membership`` (channels and the channel browser, join/leave/invite/remove, members,
people, notification settings),
``reading`` (history, resume, scopes, read state), ``grants``, ``delivery``
(acks and redelivery), ``messages`` (the send path), ``reactions``, ``search``,
``admin`` (the workspace admin ops), ``presence`` (typing and presence, never
stored), ``profiles`` (display names), ``tasks`` (task scopes), ``workflows`` (workflow
plans and their transcript), ``rewind`` (recovery points and rewinds). Handlers
see the session
only through :class:`node.ops.context.Context`.
"""

from __future__ import annotations

from typing import Any

from node.ops import (
    admin,
    cards,
    delivery,
    grants,
    membership,
    messages,
    presence,
    profiles,
    reactions,
    reading,
    rewind,
    schedules,
    search,
    services,
    tasks,
    workflows,
)
from node.ops.context import Context
from node.ops.delivery import redeliver
from node.ops.reading import resume
from protocol.admin import ADMIN_OPS
from protocol.cards import CardAction, PostCard, RevokeShare, ShareChannel, ShareMessage, UpdateCard
from protocol.errors import ErrorCode, OperationError
from protocol.frames import (
    Ack,
    Channels,
    CreateChannel,
    Delete,
    Edit,
    Grant,
    History,
    Invite,
    Join,
    Leave,
    MarkRead,
    Members,
    People,
    React,
    Remove,
    RevokeGrant,
    Scopes,
    Search,
    SetNotification,
    UpdateProfile,
)
from protocol.presence import PresenceList, SetPresence, Typing
from protocol.rewind import MarkRecoveryPoint, Rewind
from protocol.schedules import (
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    Schedules,
    UpdateSchedule,
)
from protocol.services import ServicePost
from protocol.tasks import CreateTask, Tasks, UpdateTask
from protocol.workflows import (
    CreateWorkflowPlan,
    ShareWorkflowPlan,
    UpdateWorkflowPlan,
    WorkflowPlans,
    WorkflowReply,
    WorkflowRequest,
    WorkflowTranscript,
)

__all__ = ["handle", "redeliver", "resume"]


async def handle(ctx: Context, request: Any) -> Any:
    match request:
        case History():
            return await reading.history(ctx, request)
        case Scopes():
            return await reading.list_scopes(ctx)
        case Members():
            return await membership.list_members(ctx, request)
        case Channels():
            return await membership.list_channels(ctx)
        case People():
            return await membership.list_people(ctx)
        case CreateChannel():
            return await membership.create_channel(ctx, request)
        case Join() | Leave():
            return await membership.roster(ctx, request)
        case Invite():
            return await membership.invite(ctx, request)
        case Remove():
            return await membership.remove(ctx, request)
        case SetNotification():
            return await membership.set_notification(ctx, request)
        case MarkRead():
            return await reading.mark_read(ctx, request)
        case Ack():
            return await delivery.ack(ctx, request)
        case Grant():
            return await grants.grant(ctx, request)
        case RevokeGrant():
            return await grants.revoke_grant(ctx, request)
        case Search():
            return await search.search(ctx, request)
        case Edit():
            return await messages.edit(ctx, request)
        case Delete():
            return await messages.delete(ctx, request)
        case React():
            return await reactions.react(ctx, request)
        case Typing():
            return await presence.typing(ctx, request)
        case SetPresence():
            return presence.set_presence(ctx, request)
        case PresenceList():
            return presence.presence(ctx, request)
        case UpdateProfile():
            return await profiles.update_profile(ctx, request)
        case ServicePost():
            return await services.service_post(ctx, request)
        case CreateTask():
            return await tasks.create_task(ctx, request)
        case UpdateTask():
            return await tasks.update_task(ctx, request)
        case Tasks():
            return await tasks.list_tasks(ctx, request)
        case CreateWorkflowPlan():
            return await workflows.create_plan(ctx, request)
        case ShareWorkflowPlan():
            return await workflows.share_plan(ctx, request)
        case UpdateWorkflowPlan():
            return await workflows.update_plan(ctx, request)
        case WorkflowPlans():
            return await workflows.list_plans(ctx)
        case WorkflowTranscript():
            return await workflows.transcript(ctx, request)
        case WorkflowRequest():
            return await workflows.request(ctx, request)
        case WorkflowReply():
            return await workflows.reply(ctx, request)
        case MarkRecoveryPoint():
            return await rewind.mark_recovery_point(ctx, request)
        case Rewind():
            return await rewind.rewind(ctx, request)
        case CreateSchedule() | UpdateSchedule() | PauseSchedule() | DeleteSchedule():
            return await schedules.change(ctx, request)
        case Schedules():
            return await schedules.list_schedules(ctx)
        case ShareChannel():
            return await cards.share_channel(ctx, request)
        case ShareMessage():
            return await cards.share_message(ctx, request)
        case RevokeShare():
            return await cards.revoke_share(ctx, request)
        case PostCard():
            return await cards.post_card(ctx, request)
        case CardAction():
            return await cards.card_action(ctx, request)
        case UpdateCard():
            return await cards.update_card(ctx, request)
    if request.__struct_config__.tag in ADMIN_OPS:
        return await admin.handle(ctx, request)
    raise OperationError(ErrorCode.BAD_FRAME, "unsupported operation")
