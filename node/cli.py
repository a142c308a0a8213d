"""``scopenode``: serve, administration (PROTOCOL.md's contract), db verify, bench.

Admin commands print one JSON object on stdout; errors go to stderr with a
non-zero exit. Without ``--database-url``/``DATABASE_URL`` they use the
embedded PostgreSQL of ``--data-dir``, starting it for their own use when no
node is running and stopping it again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from node import logs
from node.config import Settings
from node.database import open_database, verify
from storage import directory
from storage.errors import StorageError, UniqueViolation
from storage.pg import connect


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=Path(".scopenode"))
    parser.add_argument("--database-url", default=None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scopenode", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run a node")
    _common(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--node-id", default="")
    serve.add_argument("--log-level", default="info")

    admin = commands.add_parser("admin", help="provision workspaces, members, tokens")
    admin_commands = admin.add_subparsers(dest="admin_command", required=True)
    workspace = admin_commands.add_parser("create-workspace")
    workspace.add_argument("--name", required=True)
    member = admin_commands.add_parser("create-member")
    member.add_argument("--workspace", required=True)
    member.add_argument("--type", required=True, choices=[t.value for t in MemberType])
    member.add_argument("--handle", required=True)
    member.add_argument("--display-name", default=None)
    member.add_argument("--owner", default=None)
    member.add_argument("--private", action="store_true")
    token = admin_commands.add_parser("issue-token")
    token.add_argument("--member", required=True)
    revoke = admin_commands.add_parser("revoke-token")
    revoke.add_argument("--token", required=True)
    for sub in (workspace, member, token, revoke):
        _common(sub)

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    _common(db_commands.add_parser("verify", help="compare the live schema with the definition"))

    commands.add_parser(
        "bench", help="load-test a node (see `scopenode bench --help`)", add_help=False
    )
    return parser


class CliError(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["bench"]:
        from bench.cli import main as bench_main

        return bench_main(args_list[1:])
    args = build_parser().parse_args(args_list)
    if args.command == "serve":
        return _serve(args)
    logs.configure("warning")
    try:
        if args.command == "admin":
            result = trio.run(_with_database, args, _ADMIN[args.admin_command])
        else:
            result = trio.run(_with_database, args, _db_verify)
    except (CliError, StorageError) as exc:
        print(f"scopenode: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1


def _serve(args: argparse.Namespace) -> int:
    from node.app import serve_node

    settings = Settings(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        database_url=args.database_url or Settings.database_url_from_env(),
        node_id=args.node_id,
        log_level=args.log_level,
    )
    logs.configure(settings.log_level)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve_node, settings)
    return 0


Handler = Callable[[argparse.Namespace, str], Awaitable[dict[str, Any]]]


async def _with_database(args: argparse.Namespace, handler: Handler) -> dict[str, Any]:
    url = args.database_url or Settings.database_url_from_env()
    async with open_database(args.data_dir, url) as dsn:
        return await handler(args, dsn)


async def _create_workspace(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        return {"workspaceId": await directory.create_workspace(conn, args.name)}


async def _create_member(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    if args.private and not args.owner:
        raise CliError("--private needs --owner")
    if args.private and args.type != "agent":
        raise CliError("only agents can be private")
    async with await connect(dsn, autocommit=True) as conn:
        if args.owner:
            owner = await directory.get_member(conn, args.owner)
            if owner is None or owner.workspace_id != args.workspace:
                raise CliError(f"no member {args.owner} in workspace {args.workspace}")
            if owner.type is not MemberType.HUMAN:
                raise CliError("an owner must be a human member")
        try:
            member = await directory.create_member(
                conn,
                workspace_id=args.workspace,
                type_=MemberType(args.type),
                handle=args.handle,
                display_name=args.display_name,
                owner_member_id=args.owner,
                private=args.private,
            )
        except UniqueViolation:
            raise CliError(f"handle {args.handle!r} is taken in that workspace") from None
        except StorageError as exc:
            raise CliError(f"cannot create member: {exc}") from None
    return {"memberId": member.id}


async def _issue_token(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        if await directory.get_member(conn, args.member) is None:
            raise CliError(f"no member {args.member}")
        return {"token": await directory.issue_token(conn, args.member)}


async def _revoke_token(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    async with await connect(dsn, autocommit=True) as conn:
        if not await directory.revoke_token(conn, args.token):
            raise CliError("no such active token")
    return {"revoked": True}


async def _db_verify(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    drift = await trio.to_thread.run_sync(verify, dsn)
    if drift:
        return {"ok": False, "drift": drift}
    return {"ok": True}


_ADMIN: dict[str, Handler] = {
    "create-workspace": _create_workspace,
    "create-member": _create_member,
    "issue-token": _issue_token,
    "revoke-token": _revoke_token,
}
