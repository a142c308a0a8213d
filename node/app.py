"""Wiring: database, pool, actors, hub, listener; graceful drain on SIGTERM."""

from __future__ import annotations

import math
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import structlog
import trio

from actors.model import MemberType
from node.attachments import sweep_forever as sweep_attachments
from node.config import Settings, load_moderation, web_origin
from node.database import autocommit, open_database
from node.hub import Hub
from node.memory import CollectorWatch, MemoryGovernor
from node.metrics import Metrics
from node.outbox_worker import OutboxWorker
from node.registry import ActorRegistry
from node.relay import ClusterRelay
from node.resolver import Resolver
from node.revocation import watch_revocations
from node.scheduler import Scheduler
from node.server import handle_connection, serve_metrics
from node.services import Services
from protocol.errors import CloseCode
from storage import directory, invites, outbox, scopes, search_terms
from storage.errors import StorageError
from storage.group_commit import GroupCommitter
from storage.pool import Pool, open_pool
from storage.store import PgScopeStore

log = structlog.get_logger(__name__)
MARK_INTERVAL = 0.5
DRAIN_TIMEOUT = 10.0
DRAIN_SPREAD = 2.0
DRAIN_STEPS = 20
HEALTH_WINDOW = 1.0  # HAProxy: 2 failed checks 500 ms apart (deploy/haproxy.cfg)


class DeliveredMarker:
    """Marks inline-delivered outbox rows in batches, off the send path."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._keys: list[str] = []
        self._wake = trio.Event()

    def add(self, keys: Sequence[str]) -> None:
        self._keys.extend(keys)
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep(MARK_INTERVAL)
            await self.flush()

    async def flush(self) -> None:
        keys, self._keys = self._keys, []
        if not keys:
            return
        try:
            async with self._pool.connection() as conn:
                await outbox.mark_delivered(conn, keys)
        except Exception as exc:
            # The rows stay pending; the outbox worker replays them.
            log.warning("outbox_mark_failed", count=len(keys), error=repr(exc))


async def serve_node(
    settings: Settings,
    *,
    on_ready: Callable[[], object] | None = None,
    task_status: trio.TaskStatus[Services] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a node until cancelled or drained; reports its Services when it accepts
    sessions. ``on_ready`` runs once everything is up, before that report (the
    ``serve`` command settles the process's heap there: node/memory.py)."""
    node_id = settings.node_id or f"node-{socket.gethostname()}-{os.getpid()}"
    async with (
        open_database(settings.data_dir, settings.database_url) as dsn,
        open_pool(dsn, size=settings.pool_size, configure=autocommit) as pool,
        trio.open_nursery() as nursery,
    ):
        async with pool.connection() as conn:
            # A language the database lacks would fail every search: refuse to start.
            language = await search_terms.check_language(conn, settings.search_language)
        settings = replace(settings, search_language=language)
        marker = DeliveredMarker(pool)
        metrics = Metrics()
        hub = Hub(marker.add, metrics.delivery.observe)
        committer = None
        if settings.commit_lanes > 0:
            committer = GroupCommitter(
                pool, lanes=settings.commit_lanes, gather=settings.commit_gather_ms / 1000
            )
            nursery.start_soon(committer.run)
            group = committer
            metrics.gauges["group_commit_statements"] = lambda: float(group.transactions)
            metrics.gauges["group_commit_sends"] = lambda: float(group.plans_committed)
        registry = ActorRegistry(
            nursery,
            PgScopeStore(pool, committer, on_commit=metrics.send_commit.observe),
            hub,
            idle_timeout=settings.actor_idle_timeout,
            on_send=metrics.on_send,
            row_limit=settings.row_limit,
        )
        services = Services(
            settings=settings,
            node_id=node_id,
            pool=pool,
            registry=registry,
            hub=hub,
            metrics=metrics,
            resolver=Resolver(pool),
            limiter=settings.limiter(),
            invite_limiter=settings.invite_limiter(),
        )
        services.moderation = load_moderation(settings)
        if settings.moderation_file is not None:
            nursery.start_soon(reload_moderation_on_hup, services)
        metrics.gauges["sessions"] = lambda: float(len(services.sessions))
        metrics.gauges["actors"] = lambda: float(len(registry))
        metrics.gauges["fence_losses"] = lambda: float(registry.fence_losses)
        governor = MemoryGovernor(registry, settings.memory_ceiling_mb * 2**20)
        metrics.gauges["resident_bytes"] = lambda: float(governor.last_rss)
        metrics.gauges["memory_ceiling_bytes"] = lambda: float(governor.ceiling_bytes)
        metrics.gauges["memory_passivated_actors"] = lambda: float(governor.passivated)
        nursery.start_soon(governor.run)
        collector = CollectorWatch()
        collector.install()
        nursery.start_soon(_uninstall_on_exit, collector)
        metrics.gauges["gc_full_collections"] = lambda: float(collector.full_collections)
        metrics.gauges["gc_full_pause_seconds"] = lambda: collector.full_pause_s
        metrics.gauges["gc_longest_full_pause_seconds"] = lambda: collector.longest_full_pause_s
        nursery.start_soon(marker.run)
        worker = OutboxWorker(pool, hub, node_id, settings.outbox, metrics.set_outbox_states)
        services.worker = worker
        nursery.start_soon(worker.run)
        nursery.start_soon(sweep_sessions, services)
        # Started: the attachment store is private and holds no dead staging file.
        await nursery.start(sweep_attachments, services)
        await nursery.start(watch_revocations, dsn, hub)
        relay = ClusterRelay(dsn, pool, hub, node_id)
        await nursery.start(relay.run)
        hub.relay = relay
        services.scheduler = Scheduler(services)
        nursery.start_soon(services.scheduler.run)
        listeners = await trio.open_tcp_listeners(settings.port, host=settings.host)
        # Connections live in the node's nursery, so that draining can stop
        # the accept loop (cancel, then close the listeners) and keep sessions.
        accepting = trio.CancelScope()
        nursery.start_soon(_accept, accepting, services, listeners, nursery)
        services.port = listeners[0].socket.getsockname()[1]
        if settings.metrics_bind is not None:
            metrics_host, metrics_port = settings.metrics_bind
            services.metrics_port = await nursery.start(
                serve_metrics, services, metrics_host, metrics_port
            )
            log.info("metrics_ready", host=metrics_host, port=services.metrics_port)
        await announce_origin(services)
        await first_run(services, settings.data_dir)
        if on_ready is not None:
            on_ready()
        services.ready = True
        port = services.port
        log.info("node_ready", node_id=node_id, url=f"ws://{settings.host}:{port}/v1/ws")
        task_status.started(services)
        await _wait_for_signal()
        await drain(services, listeners, accepting)
        await marker.flush()
        nursery.cancel_scope.cancel()


async def _uninstall_on_exit(collector: CollectorWatch) -> None:
    # A process that runs several nodes one after another (the test suite)
    # keeps no callback of a stopped one.
    try:
        await trio.sleep_forever()
    finally:
        collector.uninstall()


async def sweep_sessions(services: Services) -> None:
    """Heartbeat, hello and slow-consumer deadlines for every session, from one task."""
    period = min(1.0, services.settings.slow_consumer_grace / 4)
    while True:
        await trio.sleep(period)
        now = trio.current_time()
        for session in list(services.sessions):
            session.check(now)


async def reload_moderation_on_hup(services: Services) -> None:
    """Re-read ``--moderation-file`` on SIGHUP; a file that cannot be read keeps
    the list in force (and says so in the log)."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            try:
                keywords = load_moderation(services.settings)
            except (OSError, UnicodeDecodeError) as exc:
                log.error("moderation_reload_failed", error=str(exc))
                continue
            services.moderation = keywords
            log.info("moderation_reloaded", keywords=len(keywords))


async def _wait_for_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("node_draining", signal=signal.Signals(signum).name)
            return


async def _accept(
    accepting: trio.CancelScope,
    services: Services,
    listeners: Sequence[trio.SocketListener],
    handler_nursery: trio.Nursery,
) -> None:
    with accepting:
        await trio.serve_listeners(
            partial(handle_connection, services), list(listeners), handler_nursery=handler_nursery
        )


async def drain(
    services: Services, listeners: Sequence[trio.SocketListener], accepting: trio.CancelScope
) -> None:
    """Refuse new sessions, close sessions with 4503, let actors finish what they hold.

    The listener stays open for the whole window: ``/healthz`` answers 503 (and
    a WebSocket upgrade 503) instead of a refused connection, so a proxy's
    health check marks the node down on a clear answer and a client that
    reached it in the meantime is told to go elsewhere.
    """
    services.draining = True
    services.registry.draining = True
    try:
        await _close_sessions(services)
    finally:
        # Closing a listener under a pending accept() would crash the accept
        # loop (ClosedResourceError) and with it the node: cancel the loop first.
        accepting.cancel()
        for listener in listeners:
            await listener.aclose()


async def _close_sessions(services: Services) -> None:
    # Sessions stay up until a proxy checking /healthz has seen the 503s and
    # stopped routing here; closed earlier, their reconnects could land here again.
    await trio.sleep(HEALTH_WINDOW)
    # Spread over DRAIN_SPREAD seconds, so that the clients' reconnects (and
    # resumes) land on the other nodes as a ramp, not as one burst.
    sessions = list(services.sessions)
    chunk = max(1, math.ceil(len(sessions) / DRAIN_STEPS))
    for start in range(0, len(sessions), chunk):
        if start:
            await trio.sleep(DRAIN_SPREAD / DRAIN_STEPS)
        for session in sessions[start : start + chunk]:
            session.close(CloseCode.DRAINING, "node draining; reconnect")
    with trio.move_on_after(DRAIN_TIMEOUT):
        # Sessions end on their own schedule; actors finish what they hold, so
        # nothing already handed to an actor is cut off mid-commit.
        while services.sessions or services.registry.busy():  # noqa: ASYNC110
            await trio.sleep(0.05)


async def announce_origin(services: Services) -> None:
    """Record where this node's web client is, for the invite links that
    admin commands print (they run in processes that know no node flags)."""
    origin = web_origin(services.settings.host, services.port, services.settings.public_url)
    try:
        async with services.pool.connection() as conn:
            await invites.record_web_origin(conn, origin, services.node_id)
    except StorageError as exc:
        # Links then point where a later node, or the default address, says.
        log.warning("web_origin_not_recorded", code=exc.code)


async def first_run(services: Services, data_dir: Path) -> None:
    """On an empty database: a demo workspace, one human, #general, a token to print."""
    token_file = data_dir / "demo-token"
    async with services.pool.connection() as conn:
        if (first := await directory.first_human(conn)) is not None:
            if token_file.exists():
                _announce(services, first.workspace_id, token_file.read_text().strip())
            return
        workspace_id = await directory.create_workspace(conn, "demo")
        # The one who started the node runs the workspace.
        human = await directory.create_member(
            conn, workspace_id=workspace_id, type_=MemberType.HUMAN, handle="demo", admin=True
        )
        await scopes.create_general(conn, human)
        token = await directory.issue_token(conn, human.id)
    await trio.to_thread.run_sync(_write_secret, token_file, token)
    _announce(services, workspace_id, token)


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    path.chmod(0o600)


def _announce(services: Services, workspace_id: str, token: str) -> None:
    settings = services.settings
    print(
        f"scopenode ready: ws://{settings.host}:{services.port}/v1/ws  "
        f"web client: http://{settings.host}:{services.port}/\n"
        f"workspace: {workspace_id}\n"
        f"login: {login_link(settings.host, services.port, token, settings.public_url)}\n"
        f"demo token: {token}",
        flush=True,
    )


def login_link(host: str, port: int, token: str, public_url: str | None = None) -> str:
    """The web client's one-click sign-in: the token rides in the fragment,
    which browsers never send to a server or put in a Referer."""
    return f"{web_origin(host, port, public_url)}/#token={token}"
