"""``scopenode``: serve, administration, db verify, search, and the registered commands.

``serve``, ``admin``, ``db`` and ``search`` are defined here. Every other
command is registered by its package under the ``scopenode.commands`` entry
point group (pyproject.toml): ``scopenode NAME ARGS…`` loads NAME's
``main(args) -> int`` and hands it the rest of the line, so this module never
imports the code of a command it does not run.

Admin commands print one JSON object on stdout. Every error is one line on
stderr naming the argument and what is wrong, with exit code 2: never a
database message or a traceback. Without ``--database-url``/``DATABASE_URL``
they use the embedded PostgreSQL of ``--data-dir``, starting it for their own
use when no node is running and stopping it again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import trio

from actors.model import MemberType
from node import logs
from node.config import MAX_ATTACHMENT_BYTES, Settings, load_moderation
from node.database import open_database, verify
from node.listen import address_in_use, listen_problem
from storage import directory, scopes, search_index
from storage.errors import (
    DatabaseUnavailable,
    EmbeddedPostgresError,
    StorageError,
    UniqueViolation,
)
from storage.pg import TrioConnection, connect
from storage.schema import SchemaError

# The same patterns as the schema's CHECKs, so bad input is named before the
# database would answer with a constraint name.
HANDLE_PATTERN = "[a-z0-9][a-z0-9_.-]{0,63}"
SLUG_PATTERN = "[a-z0-9][a-z0-9_-]{0,79}"
WORKSPACE_NAME_MAX = 200
USAGE_ERROR = 2
COMMANDS_GROUP = "scopenode.commands"
BUILT_IN_COMMANDS = ("serve", "admin", "db", "search")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``prog: what is wrong``."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: {message}\n")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=Path(".scopenode"))
    parser.add_argument("--database-url", default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="scopenode", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run a node")
    _common(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--node-id", default="")
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--moderation-file",
        type=Path,
        default=None,
        help="keyword list, one keyword or phrase per line; human sends that match are "
        "refused (moderation_blocked); re-read on SIGHUP",
    )
    serve.add_argument(
        "--attachments-dir",
        type=Path,
        default=None,
        help="where uploaded files are kept (default: DATA_DIR/attachments); "
        "the nodes of a cluster share one directory",
    )
    serve.add_argument(
        "--max-attachment-bytes",
        type=_positive_int,
        default=MAX_ATTACHMENT_BYTES,
        help="largest upload accepted (default 25 MiB); larger ones are answered 413",
    )
    serve.add_argument(
        "--metrics-bind",
        type=_bind_address,
        default=None,
        metavar="ADDR:PORT",
        help="a second listener that answers /metrics (only) to whoever reaches it; "
        "/metrics on --port answers loopback peers and SCOPENODE_METRICS_TOKEN holders only",
    )

    admin = commands.add_parser("admin", help="provision workspaces, members, tokens")
    admin_commands = admin.add_subparsers(dest="admin_command", required=True)
    workspace = admin_commands.add_parser("create-workspace")
    workspace.add_argument("--name", required=True)
    member = admin_commands.add_parser(
        "create-member",
        help="a new member; humans and public agents join the default channels",
    )
    member.add_argument("--workspace", required=True)
    member.add_argument("--type", required=True, choices=[t.value for t in MemberType])
    member.add_argument("--handle", required=True)
    member.add_argument("--display-name", default=None)
    member.add_argument("--owner", default=None)
    member.add_argument("--private", action="store_true")
    member.add_argument(
        "--join",
        nargs="+",
        action="extend",
        default=[],
        metavar="#SLUG",
        help="more channels to join besides the workspace's default ones",
    )
    token = admin_commands.add_parser("issue-token")
    token.add_argument("--member", required=True)
    revoke = admin_commands.add_parser("revoke-token")
    revoke.add_argument("--token", required=True)
    list_workspaces = admin_commands.add_parser("list-workspaces")
    list_members = admin_commands.add_parser("list-members")
    list_members.add_argument("--workspace", required=True)
    list_channels = admin_commands.add_parser("list-channels")
    list_channels.add_argument("--workspace", required=True)
    for sub in (workspace, member, token, revoke, list_workspaces, list_members, list_channels):
        _common(sub)

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    _common(db_commands.add_parser("verify", help="compare the live schema with the definition"))

    search = commands.add_parser("search", help="the search index of a workspace")
    search_commands = search.add_subparsers(dest="search_command", required=True)
    for name, text in (
        ("status", "readiness and counts"),
        ("rebuild", "backfill every message, then finalize; prints the final status"),
    ):
        sub = search_commands.add_parser(name, help=text)
        sub.add_argument("--workspace", help="required when there is more than one")
        _common(sub)

    for name in sorted(registered_commands()):
        commands.add_parser(name, help=f"see `scopenode {name} --help`", add_help=False)
    return parser


def registered_commands() -> dict[str, EntryPoint]:
    """The commands other packages register, by name; none is imported here.

    A name the node defines itself stays the node's.
    """
    found = entry_points(group=COMMANDS_GROUP)
    return {e.name: e for e in found if e.name not in BUILT_IN_COMMANDS}


class CliError(Exception):
    """A one-line error for the operator: ``--argument: what is wrong``."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] not in BUILT_IN_COMMANDS:
        command = registered_commands().get(args_list[0])
        if command is not None:
            run: Callable[[list[str]], int] = command.load()
            return run(args_list[1:])
    args = build_parser().parse_args(args_list)
    if args.command == "serve":
        return _serve(args)
    logs.configure("warning")
    try:
        if args.command == "admin":
            result = trio.run(_with_database, args, _ADMIN[args.admin_command])
        elif args.command == "search":
            result = trio.run(_with_database, args, _SEARCH[args.search_command])
        else:
            result = trio.run(_with_database, args, _db_verify)
    except (CliError, StorageError, SchemaError, psycopg.Error) as exc:
        print(f"scopenode: {_describe(args, exc)}", file=sys.stderr)
        return USAGE_ERROR
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1


def _describe(args: argparse.Namespace, exc: Exception) -> str:
    """One line in words; a database's own message never reaches the operator."""
    if isinstance(exc, CliError | EmbeddedPostgresError | SchemaError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, DatabaseUnavailable | psycopg.OperationalError):
        if args.database_url or Settings.database_url_from_env():
            return "--database-url: cannot reach the database"
        return f"--data-dir: cannot reach the embedded database of {args.data_dir}"
    code = exc.code if isinstance(exc, StorageError) else type(exc).__name__
    return f"the database refused the command ({code})"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _bind_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``[v6]:PORT`` for an IPv6 address) as (host, port)."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDR:PORT (a port from 1 to 65535)")
    return host, int(port)


def _serve(args: argparse.Namespace) -> int:
    from node.app import serve_node
    from node.memory import limit_allocator_arenas

    problem = listen_problem(args.host, args.port)
    if problem is not None:
        # Checked before anything is created: a busy port must not leave a
        # freshly initialised data dir behind.
        print(f"scopenode: {problem}", file=sys.stderr)
        return USAGE_ERROR
    if args.metrics_bind is not None:
        host, port = args.metrics_bind
        flag = "--metrics-bind"
        if problem := listen_problem(host, port, host_flag=flag, port_flag=flag):
            print(f"scopenode: {problem}", file=sys.stderr)
            return USAGE_ERROR
    settings = Settings(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        database_url=args.database_url or Settings.database_url_from_env(),
        node_id=args.node_id,
        log_level=args.log_level,
        moderation_file=args.moderation_file,
        attachments_dir=args.attachments_dir,
        max_attachment_bytes=args.max_attachment_bytes,
        metrics_bind=args.metrics_bind,
    )
    try:
        load_moderation(settings)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        print(f"scopenode: --moderation-file: {reason}", file=sys.stderr)
        return USAGE_ERROR
    logs.configure(settings.log_level)
    # Before trio starts its worker threads (node/memory.py says why).
    limit_allocator_arenas()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            trio.run(serve_node, settings)
    except BaseException as exc:
        # Another process may take the port between the check and the bind.
        if not address_in_use(exc):
            raise
        print(f"scopenode: port {args.port} is in use; pass --port", file=sys.stderr)
        return USAGE_ERROR
    return 0


Handler = Callable[[argparse.Namespace, str], Awaitable[dict[str, Any]]]


async def _with_database(args: argparse.Namespace, handler: Handler) -> dict[str, Any]:
    url = args.database_url or Settings.database_url_from_env()
    async with open_database(args.data_dir, url) as dsn:
        return await handler(args, dsn)


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
    slugs = [slug.removeprefix("#").lower() for slug in args.join]
    for slug in slugs:
        if not re.fullmatch(SLUG_PATTERN, slug):
            raise CliError(f"--join: #{slug} is not a channel name ({SLUG_PATTERN})")
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        if args.owner:
            owner = await directory.get_member(conn, args.owner)
            if owner is None or owner.workspace_id != workspace_id:
                raise CliError(f"--owner: no member {args.owner} in workspace {workspace_id}")
            if owner.type is not MemberType.HUMAN:
                raise CliError(f"--owner: {args.owner} is not a human member")
        if await directory.get_member_by_handle(conn, workspace_id, handle) is not None:
            raise CliError(f"--handle: {handle} is taken in workspace {workspace_id}")
        extra = []
        for slug in slugs:
            scope_id = await scopes.channel_by_slug(conn, workspace_id, slug)
            if scope_id is None:
                raise CliError(f"--join: no channel #{slug} in workspace {workspace_id}")
            extra.append(scope_id)
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
    return {"memberId": member.id, "channels": [f"#{channels[s]}" for s in joined]}


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
            }
            for m, status in members
        ],
    }


async def _list_channels(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        workspace_id = await _workspace(conn, args.workspace)
        channels = await scopes.admin_channels(conn, workspace_id)
    return {
        "workspaceId": workspace_id,
        "channels": [
            {
                "scopeId": c.scope_id,
                "slug": c.slug,
                "name": c.name,
                "visibility": c.visibility,
                "default": c.default,
                "ownerMemberId": c.owner_member_id,
                "memberCount": c.members,
                "latestSeq": c.latest_seq,
            }
            for c in channels
        ],
    }


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
}
