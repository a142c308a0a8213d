"""``scopenode``: serve, administration, db verify, search, and the registered commands.

``serve``, ``admin``, ``db`` and ``search`` are defined here (the last three
run in node/admin_commands.py, imported only when one of them runs). Every other
command is registered by its package under the ``scopenode.commands`` entry
point group (pyproject.toml): ``scopenode NAME ARGS…`` loads NAME's
``main(args) -> int`` and hands it the rest of the line, so this module never
imports the code of a command it does not run.

Admin commands print one JSON object on stdout (``admin batch`` one per line
of its input). Every error is one line on stderr naming the argument and what
is wrong, with exit code 2: never a database message or a traceback. Without
``--database-url``/``DATABASE_URL`` they use the embedded PostgreSQL of
``--data-dir``, starting it for their own use when no node is running and
stopping it again.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from actors.model import MemberType
from node.listen import address_in_use, listen_problem

USAGE_ERROR = 2
COMMANDS_GROUP = "scopenode.commands"
BUILT_IN_COMMANDS = ("serve", "admin", "db", "search", "mcp")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``prog: what is wrong``."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: {message}\n")


class BatchLineError(ValueError):
    """A line of ``admin batch`` that is not an admin command."""


class _LineParser(_Parser):
    """The admin commands of one ``admin batch`` line: errors raise, the batch goes on."""

    def error(self, message: str) -> NoReturn:
        raise BatchLineError(f"{self.prog}: {message}")

    def print_help(self, file: Any = None) -> None:
        raise BatchLineError(f"{self.prog}: --help is not an admin command")


def parse_batch_line(words: list[str]) -> argparse.Namespace:
    """One line of ``admin batch``: an admin command and its arguments, as
    after ``scopenode admin`` on a command line."""
    if words[:1] == ["batch"]:
        raise BatchLineError("scopenode admin: batch cannot run inside a batch")
    return build_parser(_LineParser).parse_args(["admin", *words])


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=Path(".scopenode"))
    parser.add_argument("--database-url", default=None)


def build_parser(parser_class: type[_Parser] = _Parser) -> argparse.ArgumentParser:
    parser = parser_class(prog="scopenode", description=__doc__)
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
        # None stands for node/config.py's default, which this module does not import.
        default=None,
        help="largest upload accepted (default 25 MiB); larger ones are answered 413",
    )
    serve.add_argument(
        "--public-url",
        type=_public_url,
        default=None,
        metavar="URL",
        help="where people reach this node's web client (http[s]://host[:port][/path]); "
        "the login link and invite links are built from it (default: http://HOST:PORT)",
    )
    serve.add_argument(
        "--metrics-bind",
        type=_bind_address,
        default=None,
        metavar="ADDR:PORT",
        help="a second listener that answers /metrics (only) to whoever reaches it; "
        "/metrics on --port answers loopback peers and SCOPENODE_METRICS_TOKEN holders only",
    )

    serve.add_argument(
        "--search-language",
        default=None,
        metavar="CONFIG",
        help="the PostgreSQL text search configuration whose stems search words also match "
        "(default: SCOPENODE_SEARCH_LANGUAGE, else english)",
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
    _add_join(member, "more channels to join besides the workspace's default ones")
    token = admin_commands.add_parser("issue-token")
    token.add_argument("--member", required=True)
    revoke = admin_commands.add_parser("revoke-token")
    revoke.add_argument("--token", required=True)
    list_workspaces = admin_commands.add_parser("list-workspaces")
    list_members = admin_commands.add_parser("list-members")
    list_members.add_argument("--workspace", required=True)
    list_channels = admin_commands.add_parser("list-channels")
    list_channels.add_argument("--workspace", required=True)
    channel = admin_commands.add_parser(
        "create-channel", help="a channel, owned by --owner or the workspace's first admin"
    )
    channel.add_argument("--workspace", required=True)
    channel.add_argument("--slug", required=True)
    channel.add_argument("--name", default=None)
    channel.add_argument("--owner", default=None)
    channel.add_argument("--private", action="store_true")
    channel.add_argument(
        "--default", action="store_true", help="new humans and public agents join it"
    )
    deactivate = admin_commands.add_parser(
        "deactivate-member", help="revoke every token of the member and refuse it from now on"
    )
    deactivate.add_argument("--member", required=True)
    promote = admin_commands.add_parser("promote", help="make a human member an admin")
    promote.add_argument("--member", required=True)
    demote = admin_commands.add_parser("demote", help="make an admin a plain member again")
    demote.add_argument("--member", required=True)
    invite = admin_commands.add_parser(
        "create-invite", help="a link that lets a person create their own human member"
    )
    invite.add_argument("--workspace", required=True)
    invite.add_argument(
        "--expires", default="7d", metavar="DURATION", help="30s, 15m, 12h or 7d (default 7d)"
    )
    invite.add_argument(
        "--uses", type=_positive_int, default=None, help="how many members it may create"
    )
    _add_join(invite, "channels its members join besides the workspace's default ones")
    revoke_invite = admin_commands.add_parser("revoke-invite")
    revoke_invite.add_argument("--invite", required=True)
    service = admin_commands.add_parser(
        "create-service", help="a service account whose conversation every human reads"
    )
    service.add_argument("--workspace", required=True)
    service.add_argument("--handle", required=True)
    service.add_argument("--display-name")
    service.add_argument(
        "--manager", action="append", default=[], help="a human who may post as it (repeatable)"
    )
    service_managers = admin_commands.add_parser(
        "service-managers", help="add or remove a human who may post as a service"
    )
    service_managers.add_argument("action", choices=("add", "remove"))
    service_managers.add_argument("--service", required=True, help="its handle or member id")
    service_managers.add_argument("--member", required=True)
    service_token = admin_commands.add_parser(
        "issue-service-token", help="a token for the service's webhook and sessions"
    )
    service_token.add_argument("--service", required=True, help="its handle or member id")
    batch = admin_commands.add_parser(
        "batch",
        help="admin commands read from stdin, one JSON array of words per line "
        '(e.g. ["issue-token", "--member", "MEM"]); one JSON result per line',
    )
    for sub in (
        batch,
        workspace,
        member,
        token,
        revoke,
        list_workspaces,
        list_members,
        list_channels,
        channel,
        deactivate,
        promote,
        demote,
        invite,
        revoke_invite,
        service,
        service_managers,
        service_token,
    ):
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

    # Its own parser (node/mcp/cli.py) reads the rest of the line.
    commands.add_parser("mcp", help="serve an agent's tools to an MCP client", add_help=False)
    for name in sorted(registered_commands()):
        commands.add_parser(name, help=f"see `scopenode {name} --help`", add_help=False)
    return parser


def registered_commands() -> dict[str, EntryPoint]:
    """The commands other packages register, by name; none is imported here.

    A name the node defines itself stays the node's.
    """
    found = entry_points(group=COMMANDS_GROUP)
    return {e.name: e for e in found if e.name not in BUILT_IN_COMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] not in BUILT_IN_COMMANDS:
        command = registered_commands().get(args_list[0])
        if command is not None:
            run: Callable[[list[str]], int] = command.load()
            return run(args_list[1:])
    if args_list[:1] == ["mcp"]:
        from node.mcp.cli import main as mcp_main

        return mcp_main(args_list[1:])
    args = build_parser().parse_args(args_list)
    if args.command == "serve":
        return _serve(args)
    # Imported only here: psycopg, trio and storage are most of the start-up
    # time of a command, and argument errors and --help need none of them.
    from node.admin_commands import run as run_on_database
    from node.admin_commands import run_batch

    if args.command == "admin" and args.admin_command == "batch":
        return run_batch(args, parse_batch_line)
    return run_on_database(args)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _public_url(text: str) -> str:
    """An http(s) origin with an optional path, without its trailing slash."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL like https://chat.example.com"
        )
    return text.strip().rstrip("/")


def _bind_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``[v6]:PORT`` for an IPv6 address) as (host, port)."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDR:PORT (a port from 1 to 65535)")
    return host, int(port)


def _serve(args: argparse.Namespace) -> int:
    import trio

    from node import logs
    from node.app import serve_node
    from node.config import MAX_ATTACHMENT_BYTES, Settings, load_moderation
    from node.database import database_url_from_env
    from node.memory import limit_allocator_arenas, settle_heap

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
        database_url=args.database_url or database_url_from_env(),
        node_id=args.node_id,
        log_level=args.log_level,
        moderation_file=args.moderation_file,
        attachments_dir=args.attachments_dir,
        max_attachment_bytes=args.max_attachment_bytes or MAX_ATTACHMENT_BYTES,
        metrics_bind=args.metrics_bind,
        public_url=args.public_url,
    )
    if args.search_language:
        settings = replace(settings, search_language=args.search_language)
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
            trio.run(functools.partial(serve_node, settings, on_ready=settle_heap))
    except BaseException as exc:
        if (unknown := _unknown_language(exc)) is not None:
            print(f"scopenode: --search-language: {unknown}", file=sys.stderr)
            return USAGE_ERROR
        # Another process may take the port between the check and the bind.
        if not address_in_use(exc):
            raise
        print(f"scopenode: port {args.port} is in use; pass --port", file=sys.stderr)
        return USAGE_ERROR
    return 0


def _unknown_language(exc: BaseException) -> BaseException | None:
    from storage.search_terms import UnknownLanguage

    if isinstance(exc, UnknownLanguage):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _unknown_language(inner)) is not None:
                return found
    return None


def _add_join(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "--join", nargs="+", action="extend", default=[], metavar="#SLUG", help=help_text
    )
