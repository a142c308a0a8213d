"""Invite links over HTTP: ``POST /v1/invites/lookup`` and ``POST /v1/invites/redeem``.

The web client opens ``/#invite=<code>``, asks ``lookup`` what the invite is
for (the workspace's name), and ``redeem`` creates the person's member and
answers its session token (docs/invites.md). The code travels in the JSON
body, never in a URL, so no proxy or access log keeps a usable link.

Every request, answered or refused, takes a token from its client address's
bucket first (node/limits.py ``AddressLimiter``). Errors are
``{"code", "message"}`` with ``details`` when there are any, as the attachment
endpoints' are: ``404 not_found`` for a code no invite has, ``410 gone`` with
``details.reason`` for one that expired, is used up or was revoked, ``409
conflict`` naming ``$.handle`` for a handle taken, ``400 validation_failed``
naming the field, ``429 rate_limited``. A refused redemption creates nothing.
"""

from __future__ import annotations

import re
from typing import TypeVar

import h11
import msgspec
import structlog
import trio

from node.http import HttpError, Reply, json_reply, read_body
from node.limits import retry_after_ms
from node.services import Services
from protocol.errors import ErrorCode
from protocol.invites import InviteLookup, InviteRedemption, handle_problem
from protocol.text import TextKind, text_problem
from storage import invites
from storage.errors import StorageError, UniqueViolation

log = structlog.get_logger(__name__)
_Body = TypeVar("_Body", InviteLookup, InviteRedemption)

LOOKUP = "/v1/invites/lookup"
REDEEM = "/v1/invites/redeem"
# A code, a handle and a display name, with room to spare.
MAX_BODY = 8 * 1024
BODY_TIMEOUT = 10.0
# A body over the limit is still read this far (and thrown away) before the
# 413, so that the close does not reset the connection under the answer.
DRAIN_LIMIT = 64 * 1024
_PATH_IN_ERROR = re.compile(r"at `(\$[^`]*)`")
_GONE = {
    invites.InviteStatus.EXPIRED: "this invite link has expired",
    invites.InviteStatus.USED_UP: "this invite link has been used as often as it allows",
    invites.InviteStatus.REVOKED: "this invite link was revoked",
}


class InviteError(HttpError):
    """An invite endpoint's refusal."""


def is_invite_path(path: str) -> bool:
    return path in (LOOKUP, REDEEM)


async def handle(
    services: Services,
    stream: trio.SocketStream,
    http: h11.Connection,
    request: h11.Request,
    peer: str | None,
) -> Reply:
    """The answer to one invite request (its body is read here)."""
    path = request.target.decode("latin-1").split("?", 1)[0]
    try:
        if request.method != b"POST":
            raise InviteError(405, ErrorCode.BAD_FRAME, f"{path} takes POST")
        # Read before anything is refused: closing on an unread body would
        # reset the connection under the answer.
        body = await read_body(
            stream, http, max_body=MAX_BODY, drain_limit=DRAIN_LIMIT, timeout=BODY_TIMEOUT
        )
        _admit(services, peer)
        if services.draining or not services.ready:
            raise InviteError(503, ErrorCode.UNAVAILABLE, "the node is not serving; retry")
        if path == LOOKUP:
            return await _lookup(services, _decode(body, InviteLookup))
        return await _redeem(services, _decode(body, InviteRedemption))
    except HttpError as exc:
        return exc.reply()
    except StorageError as exc:
        log.warning("invite_request_failed", code=exc.code)
        return InviteError(503, ErrorCode.UNAVAILABLE, "database unavailable; retry").reply()


def _admit(services: Services, peer: str | None) -> None:
    wait = services.invite_limiter.admit(peer or "", trio.current_time())
    if wait:
        ms = retry_after_ms(wait)
        raise InviteError(
            429,
            ErrorCode.RATE_LIMITED,
            "too many invite requests from this address; retry later",
            {"retryAfterMs": ms, "bucket": "invite", "per": "address"},
            (("Retry-After", str(-(-ms // 1000))),),
        )


def _decode(body: bytes, type_: type[_Body]) -> _Body:
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        found = _PATH_IN_ERROR.search(str(exc))
        # msgspec names no path for the object itself.
        details = {"path": found[1] if found else "$"}
        raise InviteError(400, ErrorCode.VALIDATION_FAILED, str(exc), details) from None
    except msgspec.DecodeError:
        raise InviteError(400, ErrorCode.BAD_FRAME, "the body is not a JSON object") from None


def _check_code(code: str) -> str:
    # A code that breaks the text rule was never issued.
    if text_problem(code, TextKind.KEY) is not None:
        raise _unknown()
    return code


def _unknown() -> InviteError:
    return InviteError(404, ErrorCode.NOT_FOUND, "no such invite; ask for a new link")


def _unusable(status: invites.InviteStatus | None) -> InviteError:
    if status is None:
        return _unknown()
    return InviteError(410, ErrorCode.GONE, _GONE[status], {"reason": status.value})


async def _lookup(services: Services, request: InviteLookup) -> Reply:
    code = _check_code(request.code)
    async with services.pool.connection() as conn:
        state = await invites.lookup(conn, code)
    if state is None or state.status is not invites.InviteStatus.USABLE:
        raise _unusable(state.status if state else None)
    return json_reply(
        200,
        {
            "workspace": state.workspace_id,
            "workspaceName": state.workspace_name,
            "expiresAt": state.expires_at.isoformat(),
        },
    )


def _invalid(path: str, problem: str) -> InviteError:
    return InviteError(400, ErrorCode.VALIDATION_FAILED, f"{path}: {problem}", {"path": path})


async def _redeem(services: Services, request: InviteRedemption) -> Reply:
    code = _check_code(request.code)
    handle = request.handle.strip().lower()
    if (problem := handle_problem(handle)) is not None:
        raise _invalid("$.handle", problem)
    display_name = (request.display_name or "").strip() or None
    if display_name is not None and (problem := text_problem(display_name, TextKind.NAME)):
        raise _invalid("$.displayName", problem)
    async with services.pool.connection() as conn:
        try:
            redeemed = await invites.redeem(conn, code, handle=handle, display_name=display_name)
        except invites.InviteUnusable as exc:
            raise _unusable(exc.status) from None
        except UniqueViolation as exc:
            if "handle" not in (exc.constraint or ""):
                raise
            raise InviteError(
                409,
                ErrorCode.CONFLICT,
                f"$.handle: {handle} is taken; pick another",
                {"path": "$.handle"},
            ) from None
        channels = await invites.channel_slugs(conn, redeemed.joined)
    member = redeemed.member
    log.info("invite_redeemed", invite_id=redeemed.invite_id, member_id=member.id)
    return json_reply(
        200,
        {
            "token": redeemed.token,
            "workspace": member.workspace_id,
            "memberId": member.id,
            "handle": member.handle,
            "displayName": member.display_name,
            "channels": channels,
        },
    )
