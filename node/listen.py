"""Whether a node could listen on an address, asked before anything starts.

``scopenode serve`` and ``scopenode cluster up`` probe their ports the same
way, so a busy or unusable port is one line naming the flag to change, and
never a data dir or a database left behind by a bind that failed later.
"""

from __future__ import annotations

import errno
import socket


def listen_problem(
    host: str, port: int, *, host_flag: str = "--host", port_flag: str = "--port"
) -> str | None:
    """Why a node could not listen on (host, port), tried as trio will bind it;
    the flags named are the ones to change."""
    if not 0 <= port <= 65535:
        return f"{port_flag}: {port} is not a TCP port (0 to 65535)"
    if port == 0:
        return None
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return f"{host_flag}: cannot resolve {host!r}"
    for family, type_, proto, _, address in addresses:
        with socket.socket(family, type_, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"port {port} is in use; pass {port_flag}"
                return f"{host_flag}: cannot listen on {host} ({exc.strerror})"
    return None


def address_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` (or any exception inside a group) is a bind to a busy port:
    another process may take the port between the probe and the bind."""
    if isinstance(exc, OSError):
        return exc.errno == errno.EADDRINUSE
    if isinstance(exc, BaseExceptionGroup):
        return any(address_in_use(inner) for inner in exc.exceptions)
    return False
