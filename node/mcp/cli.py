"""``scopenode mcp``: run the MCP server of one agent member on stdio (or HTTP).

    scopenode mcp --url ws://127.0.0.1:8765/v1/ws --token snt_…
    scopenode mcp --url ws://127.0.0.1:8765/v1/ws --http 8766    # http://127.0.0.1:8766/mcp

The token may come from ``SCOPENODE_TOKEN`` instead, so that it stays out of
a process listing and of the MCP client's configuration file. On stdio,
standard output is the MCP channel: logs go to standard error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

TOKEN_ENV = "SCOPENODE_TOKEN"
USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scopenode mcp",
        description="Serve one agent member's tools to an MCP client on stdio.",
    )
    parser.add_argument(
        "--url", required=True, help="the node's WebSocket URL, e.g. ws://127.0.0.1:8765/v1/ws"
    )
    parser.add_argument(
        "--token", default=None, help=f"the agent member's token (default: ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--http",
        type=int,
        default=None,
        metavar="PORT",
        help="serve streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio",
    )
    parser.add_argument("--log-level", default="warning")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    token = args.token or os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"scopenode mcp: --token or ${TOKEN_ENV} is required", file=sys.stderr)
        return USAGE_ERROR
    # Imported here: --help and argument errors need none of it.
    import trio
    from trio_websocket import HandshakeError

    from node import logs
    from node.client import ConnectionClosed
    from node.mcp.run import serve_http, serve_stdio

    logs.configure(args.log_level, json=True)
    try:
        if args.http is None:
            trio.run(serve_stdio, args.url, token)
        else:
            trio.run(serve_http, args.url, token, args.http)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        # The session's end reaches here through the server's task groups.
        closed = _first(exc, ConnectionClosed)
        if closed is not None:
            print(f"scopenode mcp: the node ended the session: {closed}", file=sys.stderr)
            return USAGE_ERROR
        unreachable = _first(exc, OSError) or _first(exc, HandshakeError)
        if unreachable is not None:
            reason = unreachable.__cause__ or unreachable
            print(f"scopenode mcp: cannot reach {args.url}: {reason}", file=sys.stderr)
            return 1
        raise
    return 0


def _first(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first exception of that kind inside its exception groups."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
    return None
