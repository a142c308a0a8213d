"""Incoming webhooks: ``POST /v1/services/<handle>/messages`` (docs/services.md).

A service's token (``scopenode admin issue-service-token``) posts a message
as the service, through the same scope actor, Policy, Planner and Applier as
every send. The body is ours or Slack's incoming-webhook payload
(:mod:`protocol.webhooks`). Idempotent on ``clientMessageId`` or an
``Idempotency-Key`` header (the service is the subject); rate limited on the
service's own send bucket, shared with its WebSocket sessions. Answers: ``201
{"messageId", "seq", "scopeId"}``, ``200`` with the same body for a replay;
errors are ``{"code", "message", "details"?}`` as the other endpoints' are,
``400`` naming the field in ``details.path``; nothing is stored on an error.
"""

from __future__ import annotations

import json
import re

import h11
import structlog
import trio

from actors.ids import new_id
from actors.model import MemberType
from node.http import HttpError, Reply, json_reply, read_body
from node.limits import Kind, retry_after_ms
from node.ops.services import post_as_service
from node.services import Services
from protocol.errors import ErrorCode, OperationError
from protocol.text import TextKind, text_problem
from protocol.webhooks import MAX_CLIENT_MESSAGE_ID, PayloadError, parse
from storage import directory
from storage import services as storage_services
from storage.errors import StorageError

log = structlog.get_logger(__name__)

PATH = re.compile(r"^/v1/services/([a-z0-9][a-z0-9_.-]{0,63})/messages$")
MAX_BODY = 256 * 1024
BODY_TIMEOUT = 10.0
DRAIN_LIMIT = 1024 * 1024
SOURCE_KIND = "service_direct_post"
_STATUS = {
    ErrorCode.BAD_FRAME: 400,
    ErrorCode.VALIDATION_FAILED: 400,
    ErrorCode.INVALID_TARGET: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
}


class WebhookError(HttpError):
    """A webhook endpoint's refusal."""


def is_webhook_path(path: str) -> bool:
    return path.startswith("/v1/services/")


async def handle(
    services: Services, stream: trio.SocketStream, http: h11.Connection, request: h11.Request
) -> Reply:
    """The answer to one webhook request (its body is read here)."""
    path = request.target.decode("latin-1").split("?", 1)[0]
    try:
        matched = PATH.match(path)
        if matched is None:
            raise WebhookError(404, ErrorCode.NOT_FOUND, "POST /v1/services/<handle>/messages")
        if request.method != b"POST":
            raise WebhookError(405, ErrorCode.BAD_FRAME, f"{path} takes POST")
        # Read before anything is refused: closing on an unread body would
        # reset the connection under the answer.
        body = await read_body(
            stream, http, max_body=MAX_BODY, drain_limit=DRAIN_LIMIT, timeout=BODY_TIMEOUT
        )
        if services.draining or not services.ready:
            raise WebhookError(503, ErrorCode.UNAVAILABLE, "the node is not serving; retry")
        return await _post(services, request, matched[1], body)
    except HttpError as exc:
        return exc.reply()
    except StorageError as exc:
        log.warning("webhook_failed", code=exc.code)
        return WebhookError(503, ErrorCode.UNAVAILABLE, "database unavailable; retry").reply()


async def _post(services: Services, request: h11.Request, handle: str, body: bytes) -> Reply:
    token = _bearer(request)
    async with services.pool.connection() as conn:
        found = await directory.authenticate_credential(conn, token) if token else None
        member = found[0] if found else None
        if member is None or member.type is not MemberType.SERVICE or member.handle != handle:
            raise WebhookError(
                401, ErrorCode.UNAUTHORIZED, f"Authorization: Bearer <a token of service {handle}>"
            )
        scope_id = await storage_services.service_scope(conn, member)
    if scope_id is None:
        raise WebhookError(404, ErrorCode.NOT_FOUND, "no such service")
    refusal = services.limiter.admit(Kind.SEND, member.id, member.workspace_id, trio.current_time())
    if refusal is not None:
        exc = refusal.error()
        ms = retry_after_ms(refusal.wait)
        raise WebhookError(
            429, exc.code, exc.message, exc.details, (("Retry-After", str(-(-ms // 1000))),)
        )
    try:
        post = parse(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        raise WebhookError(400, ErrorCode.BAD_FRAME, "the body is not JSON") from None
    except PayloadError as exc:
        raise WebhookError(400, ErrorCode.VALIDATION_FAILED, str(exc), {"path": exc.path}) from None
    # Without a key a retried delivery posts again, as Slack's own endpoint does.
    key = post.client_message_id or _idempotency_key(request) or new_id("hook")
    # Who wrote it (the service) is not where it came from: the source names
    # the direct post and the format it arrived in.
    source = {"kind": SOURCE_KIND, "ref": key, "format": "slack" if post.slack else "json"}
    try:
        target_scope, result = await post_as_service(
            services,
            member,
            target=post.target or f"scope:{scope_id}",
            content=post.content,
            client_message_id=key,
            metadata={"source": source},
        )
    except OperationError as exc:
        status = _STATUS.get(exc.code, 503 if exc.code.retryable else 400)
        raise WebhookError(status, exc.code, exc.message, exc.details or None) from None
    seq = result.accepted_seq if result.accepted_seq is not None else result.latest_seq
    answer = {"messageId": result.message_id, "seq": seq, "scopeId": target_scope}
    return json_reply(200 if result.state == "already_sent" else 201, answer)


def _idempotency_key(request: h11.Request) -> str | None:
    for name, value in request.headers:
        if name.lower() == b"idempotency-key":
            key = value.decode("latin-1").strip()
            if not 1 <= len(key) <= MAX_CLIENT_MESSAGE_ID or text_problem(key, TextKind.KEY):
                raise WebhookError(
                    400,
                    ErrorCode.VALIDATION_FAILED,
                    f"Idempotency-Key: 1 to {MAX_CLIENT_MESSAGE_ID} printable characters",
                    {"path": "Idempotency-Key"},
                )
            return key
    return None


def _bearer(request: h11.Request) -> str | None:
    for name, value in request.headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                token = token.strip()
                return token if text_problem(token, TextKind.KEY) is None else None
    return None
