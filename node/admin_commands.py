"""The ``scopenode`` commands that work on the database: ``admin``, ``db verify``
and ``search``.

Kept apart from node/cli.py, which imports this module only when one of these
commands runs: ``--help`` and an argument error import neither psycopg, trio
nor storage, and these commands never import node/config.py (the node's whole
module graph hangs off its settings).

Each prints one JSON object on stdout (``admin batch`` one per line of its
input); every error is one line on stderr naming the argument and what is
wrong, with exit code 2, never a database message or a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import trio

from actors.model import Member, MemberType
from node import logs
from node.database import database_url_from_env, open_database, verify
from protocol.invites import HANDLE_PATTERN
from protocol.text import TextKind, text_problem
from storage import directory, invites, scopes, search_index, services
from storage.errors import (
    DatabaseUnavailable,
    EmbeddedPostgresError,
    StorageError,
    UniqueViolation,
)
from storage.pg import TrioConnection, connect
from storage.schema import SchemaError

# The same patterns as the schema's CHECKs (the handle's, shared with the
# invite endpoint, is protocol.invites'), so bad input is named before the
# database would answer with a constraint name.
SLUG_PATTERN = "[a-z0-9][a-z0-9_-]{0,79}"
WORKSPACE_NAME_MAX = 200
# Where an invite link points when no node has announced its web client on
# this database: what `scopenode serve` listens on by default.
DEFAULT_WEB_ORIGIN = "http://127.0.0.1:8765"
_DURATION = re.compile(r"([1-9][0-9]{0,6})([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_INVITE_SECONDS = 366 * 86400
# node/cli.py's exit code for a usage error; not imported from there, which
# imports this module.
USAGE_ERROR = 2

Handler = Callable[[argparse.Namespace, str], Awaitable[dict[str, Any]]]


class CliError(Exception):
    """A one-line error for the operator: ``--argument: what is wrong``."""


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``admin``, ``db`` or ``search`` command; print its result."""
    logs.configure("warning")
    return report(args)


def report(args: argparse.Namespace) -> int:
    """Run the parsed command; print its result (or its one-line error) and
    return the exit code."""
    try:
        result = trio.run(execute, args)
    except (CliError, StorageError, SchemaError, psycopg.Error) as exc:
        print(f"scopenode: {_describe(args, exc)}", file=sys.stderr)
        return USAGE_ERROR
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1


def run_batch(
    args: argparse.Namespace, parse_line: Callable[[list[str]], argparse.Namespace]
) -> int:
    """``admin batch``: the admin commands of stdin's lines, on one database
    connection setup and one interpreter (a process per command costs far
    more than the command). Each line's result, or ``{"error": …}``, is printed
    as soon as it is known; exit 1 if any line failed, 2 if the database
    cannot be reached."""
    logs.configure("warning")
    try:
        failed = trio.run(_batch, args, parse_line)
    except (CliError, StorageError, SchemaError, psycopg.Error) as exc:
        print(f"scopenode: {_describe(args, exc)}", file=sys.stderr)
        return USAGE_ERROR
    return 1 if failed else 0


async def _batch(
    args: argparse.Namespace, parse_line: Callable[[list[str]], argparse.Namespace]
) -> bool:
    failed = False
    url = args.database_url or database_url_from_env()
    async with open_database(args.data_dir, url) as dsn:
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            if not line.strip():
                continue
            result = await _batch_line(args, dsn, parse_line, line)
            failed = failed or "error" in result
            print(json.dumps(result), flush=True)
    return failed


async def _batch_line(
    args: argparse.Namespace,
    dsn: str,
    parse_line: Callable[[list[str]], argparse.Namespace],
    line: str,
) -> dict[str, Any]:
    try:
        words = json.loads(line)
    except ValueError:
        words = None
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return {"error": "scopenode admin batch: a line is a JSON array of strings"}
    try:
        command = parse_line(words)
    except ValueError as exc:
        return {"error": str(exc)}
    # The batch's own database serves every line.
    command.data_dir, command.database_url = args.data_dir, args.database_url
    try:
        return await _ADMIN[command.admin_command](command, dsn)
    except (CliError, StorageError, SchemaError, psycopg.Error) as exc:
        return {"error": f"scopenode: {_describe(command, exc)}"}


def _handler(args: argparse.Namespace) -> Handler:
    if args.command == "admin":
        return _ADMIN[args.admin_command]
    if args.command == "search":
        return _SEARCH[args.search_command]
    return _db_verify


def _describe(args: argparse.Namespace, exc: Exception) -> str:
    """One line in words; a database's own message never reaches the operator."""
    if isinstance(exc, CliError | EmbeddedPostgresError | SchemaError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, DatabaseUnavailable | psycopg.OperationalError):
        if args.database_url or database_url_from_env():
            return "--database-url: cannot reach the database"
        return f"--data-dir: cannot reach the embedded database of {args.data_dir}"
    code = exc.code if isinstance(exc, StorageError) else type(exc).__name__
    return f"the database refused the command ({code})"


async def execute(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed command's result, in the caller's trio run (errors raised, not printed)."""
    url = args.database_url or database_url_from_env()
    async with open_database(args.data_dir, url) as dsn:
        return await _handler(args)(args, dsn)


async def _workspace(conn: TrioConnection, workspace_id: str) -> str:
    if await directory.workspace_name(conn, workspace_id) is None:
        raise CliError(f"--workspace: no workspace {workspace_id}")
    return workspace_id


async def _create_workspace(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    if not 1 <= len(args.name) <= WORKSPACE_NAME_MAX:
        raise CliError(f"--name: must be 1 to {WORKSPACE_NAME_MAX} characters")
    async with await connect(dsn, autocommit=True) as conn:
        return {"workspaceId": await directory.create_workspace(conn, args.name)}


async def _create_member(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    handle = args.handle.lower()
    if not re.fullmatch(HANDLE_PATTERN, handle):
        raise CliError(f"--handle: must match {HANDLE_PATTERN}")
    if args.private and not args.owner:
        raise CliError("--private: needs --owner")
    if args.private and args.type != MemberType.AGENT.value:
        raise CliError("--private: only agents can be private")
    if args.private and args.join:
        raise CliError("--join: a private agent joins channels through its owner (invite)")
    slugs = _slugs(args.join)
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        if args.owner:
            await _human_owner(conn, args.owner, workspace_id)
        if await directory.get_member_by_handle(conn, workspace_id, handle) is not None:
            raise CliError(f"--handle: {handle} is taken in workspace {workspace_id}")
        extra = await _channels(conn, workspace_id, slugs)
        try:
            # One transaction: a member is never left half onboarded.
            async with conn.transaction():
                member = await directory.create_member(
                    conn,
                    workspace_id=workspace_id,
                    type_=MemberType(args.type),
                    handle=handle,
                    display_name=args.display_name,
                    owner_member_id=args.owner,
                    private=args.private,
                )
                joined = await scopes.join_on_creation(conn, member, extra)
        except UniqueViolation as exc:
            if "handle" not in (exc.constraint or ""):
                raise
            # A concurrent create-member took the handle after the check.
            raise CliError(f"--handle: {handle} is taken in workspace {workspace_id}") from None
        channels = {c.scope_id: c.slug for c in await scopes.admin_channels(conn, workspace_id)}
    return {
        "memberId": member.id,
        "channels": [f"#{channels[s]}" for s in joined if s in channels],
    }


async def _human_owner(conn: TrioConnection, member_id: str, workspace_id: str) -> Member:
    """``--owner``: a human member of the workspace."""
    owner = await directory.get_member(conn, member_id)
    if owner is None or owner.workspace_id != workspace_id:
        raise CliError(f"--owner: no member {member_id} in workspace {workspace_id}")
    if owner.type is not MemberType.HUMAN:
        raise CliError(f"--owner: {member_id} is not a human member")
    return owner


def _slugs(given: list[str]) -> list[str]:
    slugs = [slug.removeprefix("#").lower() for slug in given]
    for slug in slugs:
        if not re.fullmatch(SLUG_PATTERN, slug):
            raise CliError(f"--join: #{slug} is not a channel name ({SLUG_PATTERN})")
    return slugs


async def _channels(conn: TrioConnection, workspace_id: str, slugs: list[str]) -> list[str]:
    """The scope ids of ``--join``'s channels, in order."""
    found = []
    for slug in slugs:
        scope_id = await scopes.channel_by_slug(conn, workspace_id, slug)
        if scope_id is None:
            raise CliError(f"--join: no channel #{slug} in workspace {workspace_id}")
        found.append(scope_id)
    return found


async def _member(conn: TrioConnection, member_id: str) -> Member:
    member = await directory.get_member(conn, member_id)
    if member is None:
        raise CliError(f"--member: no member {member_id}")
    return member


async def _issue_token(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        if await directory.get_member(conn, args.member) is None:
            raise CliError(f"--member: no member {args.member}")
        return {"token": await directory.issue_token(conn, args.member)}


async def _revoke_token(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        if not await directory.revoke_token(conn, args.token):
            raise CliError("--token: no such active token")
    return {"revoked": True}


async def _list_workspaces(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        workspaces = await directory.list_workspaces(conn)
    return {
        "workspaces": [
            {
                "workspaceId": w.id,
                "name": w.name,
                "createdAt": w.created_at.isoformat(),
                "memberCount": w.members,
            }
            for w in workspaces
        ]
    }


async def _list_members(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        members = await directory.list_members(conn, workspace_id)
    return {
        "workspaceId": workspace_id,
        "members": [
            {
                "memberId": m.id,
                "handle": m.handle,
                "displayName": m.display_name,
                "type": m.type.value,
                "private": m.is_private,
                "ownerMemberId": m.owner_member_id,
                "status": status,
                "admin": admin,
            }
            for m, status, admin in members
        ],
    }


async def _list_channels(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        channels = await scopes.admin_channels(conn, workspace_id)
    return {
        "workspaceId": workspace_id,
        "channels": [{**c.view(), "latestSeq": c.latest_seq} for c in channels],
    }


async def _create_channel(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    slug = args.slug.removeprefix("#").lower()
    if not re.fullmatch(SLUG_PATTERN, slug):
        raise CliError(f"--slug: must match {SLUG_PATTERN}")
    if args.private and args.default:
        # Every newcomer joins a default channel: it must be one anyone may join.
        raise CliError("--default: a default channel is public")
    name = args.name if args.name is not None else slug
    if (problem := text_problem(name, TextKind.NAME)) is not None or not name:
        raise CliError(f"--name: {problem or 'must not be empty'}")
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        owner = (
            await _human_owner(conn, args.owner, workspace_id)
            if args.owner
            else await directory.channel_owner(conn, workspace_id)
        )
        if owner is None:
            raise CliError(f"--owner: workspace {workspace_id} has no human to own it")
        if await scopes.channel_by_slug(conn, workspace_id, slug) is not None:
            raise CliError(f"--slug: #{slug} exists in workspace {workspace_id}")
        visibility = "private" if args.private else "public"
        try:
            scope_id = await scopes.create_channel(
                conn,
                creator=owner,
                slug=slug,
                name=name,
                visibility=visibility,
                description="",
                default=args.default,
            )
        except UniqueViolation:
            raise CliError(f"--slug: #{slug} exists in workspace {workspace_id}") from None
    return {
        "scopeId": scope_id,
        "slug": f"#{slug}",
        "visibility": visibility,
        "default": args.default,
        "ownerMemberId": owner.id,
    }


async def _deactivate_member(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        revoked = await services.deactivate_member(conn, args.member)
    if revoked is None:
        raise CliError(f"--member: no member {args.member}")
    return {"memberId": args.member, "deactivated": True, "tokensRevoked": revoked}


async def _set_admin(args: argparse.Namespace, dsn: str, admin: bool) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        member = await _member(conn, args.member)
        if member.type is not MemberType.HUMAN:
            raise CliError(
                f"--member: {args.member} is not a human member (only humans are admins)"
            )
        await directory.set_admin(conn, member.id, admin)
    return {"memberId": member.id, "admin": admin}


async def _promote(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    return await _set_admin(args, dsn, True)


async def _demote(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    return await _set_admin(args, dsn, False)


def duration_seconds(text: str) -> int:
    """``30s``, ``15m``, ``12h`` or ``7d`` in seconds."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise CliError(f"--expires: {text!r} is not a duration like 30s, 15m, 12h or 7d")
    seconds = int(match[1]) * _SECONDS[match[2]]
    if seconds > MAX_INVITE_SECONDS:
        raise CliError("--expires: at most 366d")
    return seconds


async def _create_invite(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    expires_in = duration_seconds(args.expires)
    slugs = _slugs(args.join)
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        join = await _channels(conn, workspace_id, slugs)
        created = await invites.create_invite(
            conn, workspace_id, expires_in_s=expires_in, max_uses=args.uses, join_scope_ids=join
        )
        origin = await invites.web_origin(conn) or DEFAULT_WEB_ORIGIN
    return {
        "inviteId": created.id,
        "inviteUrl": f"{origin}/#invite={created.code}",
        "workspaceId": workspace_id,
        "expiresAt": created.expires_at.isoformat(),
        "maxUses": args.uses,
        "channels": [f"#{slug}" for slug in dict.fromkeys(slugs)],
    }


async def _revoke_invite(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        if not await invites.revoke_invite(conn, args.invite):
            raise CliError(f"--invite: no invite {args.invite}")
    return {"inviteId": args.invite, "revoked": True}


async def _create_service(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    handle = args.handle.lower()
    if not re.fullmatch(HANDLE_PATTERN, handle):
        raise CliError(f"--handle: must match {HANDLE_PATTERN}")
    name = args.display_name
    if name is not None and ((problem := text_problem(name, TextKind.NAME)) or not name.strip()):
        raise CliError(f"--display-name: {problem or 'must not be empty'}")
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        managers = [await _manager(conn, m, workspace_id) for m in dict.fromkeys(args.manager)]
        if await directory.get_member_by_handle(conn, workspace_id, handle) is not None:
            raise CliError(f"--handle: {handle} is taken in workspace {workspace_id}")
        try:
            created = await services.create_service(
                conn,
                workspace_id=workspace_id,
                handle=handle,
                display_name=name,
                managers=managers,
            )
        except UniqueViolation:
            raise CliError(f"--handle: {handle} is taken in workspace {workspace_id}") from None
    return {"memberId": created.member.id, "scopeId": created.scope_id, "handle": handle}


async def _manager(conn: TrioConnection, member_id: str, workspace_id: str) -> Member:
    """``--manager``/``--member``: an active human of the service's workspace."""
    member = await directory.get_member(conn, member_id)
    if member is None or member.workspace_id != workspace_id:
        raise CliError(f"--manager: no member {member_id} in workspace {workspace_id}")
    if member.type is not MemberType.HUMAN or not await directory.is_active(conn, member.id):
        raise CliError(f"--manager: {member_id} is not an active human member")
    return member


async def _service(conn: TrioConnection, given: str) -> services.Service:
    """``--service``: a service's handle (in the only workspace that has it) or member id."""
    member = await directory.get_member(conn, given)
    if member is None:
        found = [
            s
            for w in await directory.list_workspaces(conn)
            if (s := await services.service_by_handle(conn, w.id, given)) is not None
        ]
        if len(found) != 1:
            raise CliError(
                f"--service: no service {given}"
                if not found
                else f"--service: {given} names services in several workspaces; give its member id"
            )
        return found[0]
    scope_id = await services.service_scope(conn, member)
    if member.type is not MemberType.SERVICE or scope_id is None:
        raise CliError(f"--service: {given} is not a service")
    return services.Service(member, scope_id)


async def _service_managers(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        service = await _service(conn, args.service)
        if args.action == "add":
            manager = await _manager(conn, args.member, service.member.workspace_id)
            await services.add_manager(conn, service.member, manager)
        else:
            manager = await _member(conn, args.member)
            if not await services.remove_manager(conn, service.member, manager):
                raise CliError(f"--member: {args.member} does not manage {service.member.handle}")
        current = await services.managers(conn, service.member.id)
    return {"service": service.member.handle, "memberId": service.member.id, "managers": current}


async def _issue_service_token(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        service = await _service(conn, args.service)
        if not await directory.is_active(conn, service.member.id):
            raise CliError(f"--service: {args.service} is deactivated")
        return {"token": await directory.issue_token(conn, service.member.id)}


async def _db_verify(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    drift = await trio.to_thread.run_sync(verify, dsn)
    if drift:
        return {"ok": False, "drift": drift}
    return {"ok": True}


async def _search_workspace(conn: TrioConnection, given: str | None) -> str:
    if given is not None:
        return await _workspace(conn, given)
    found = await directory.list_workspaces(conn)
    if len(found) != 1:
        raise CliError(f"--workspace: required ({len(found)} workspaces)")
    return found[0].id


async def _search_status(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _search_workspace(conn, args.workspace)
        return (await search_index.status(conn, workspace_id)).view()


async def _search_rebuild(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _search_workspace(conn, args.workspace)
        return (await search_index.rebuild(conn, workspace_id)).view()


_SEARCH: dict[str, Handler] = {"status": _search_status, "rebuild": _search_rebuild}

_ADMIN: dict[str, Handler] = {
    "create-workspace": _create_workspace,
    "create-member": _create_member,
    "issue-token": _issue_token,
    "revoke-token": _revoke_token,
    "list-workspaces": _list_workspaces,
    "list-members": _list_members,
    "list-channels": _list_channels,
    "create-channel": _create_channel,
    "deactivate-member": _deactivate_member,
    "promote": _promote,
    "demote": _demote,
    "create-invite": _create_invite,
    "revoke-invite": _revoke_invite,
    "create-service": _create_service,
    "service-managers": _service_managers,
    "issue-service-token": _issue_service_token,
}
