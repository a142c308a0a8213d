"""The machine's own limits, measured in the same run as a workload.

* ``raw_tx`` — (a) the raw database send transaction (:mod:`bench.dbbaseline`);
* ``ws_fanout`` — (b) wsproto over trio streams (:mod:`bench.rawfanout`);
* ``node_ws_fanout`` — (c) Node.js ``ws`` (``bench/peers/ws-fanout.js``).

A part that cannot run here (no database, no Node.js) is reported as
``{"skipped": "<why>"}`` rather than failing the run.
"""

from __future__ import annotations

import importlib
import inspect
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.dbbaseline import DbPlan, measure_db
from bench.fanout_baseline import (
    FanoutPlan,
    ensure_node_peer,
    python_server_cmd,
    run_fanout_server,
)
from bench.progress import Progress


@dataclass(frozen=True)
class BaselinePlan:
    db: DbPlan | None = field(default_factory=DbPlan)
    fanout: FanoutPlan | None = field(default_factory=FanoutPlan)
    node_peer: bool = True
    database_url: str | None = None
    data_dir: str | None = None  # the node's, to reuse its embedded PostgreSQL


class NoDatabase(Exception):
    """Neither ``--database-url`` nor ``storage.embedded`` is available."""


@asynccontextmanager
async def open_database(database_url: str | None, data_dir: str | None) -> AsyncIterator[str]:
    """Yield a DSN for baseline (a).

    ``database_url`` if given; else the embedded PostgreSQL of ``data_dir``
    (the node's own server when it runs: reused, and left running); else a
    scratch embedded PostgreSQL in a temporary directory, stopped afterwards.
    """
    if database_url:
        yield database_url
        return
    try:
        embedded = importlib.import_module("storage.embedded")
    except ImportError as e:
        raise NoDatabase(f"no --database-url and storage.embedded unavailable ({e})") from e
    with tempfile.TemporaryDirectory(prefix="scopenode-bench-pg-") as tmp:
        pg = embedded.EmbeddedPostgres(Path(data_dir or tmp))
        dsn = await _call(pg.start)
        try:
            yield str(dsn)
        finally:
            with trio.CancelScope(shield=True):
                await _call(pg.stop)


async def _call(fn: Any) -> Any:
    """Await ``fn()`` if it is async; run it on a worker thread if it blocks."""
    if inspect.iscoroutinefunction(fn):
        return await fn()
    return await trio.to_thread.run_sync(fn)


async def run_baseline(plan: BaselinePlan, progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if plan.db is not None:
        progress.phase("baseline db", 1)
        try:
            async with open_database(plan.database_url, plan.data_dir) as dsn:
                out["raw_tx"] = await measure_db(dsn, plan.db)
        except NoDatabase as e:
            out["raw_tx"] = {"skipped": str(e)}
        progress.close()
    if plan.fanout is not None:
        fan = plan.fanout
        progress.phase("baseline ws", 1)
        out["ws_fanout"] = await trio.to_thread.run_sync(
            run_fanout_server, python_server_cmd(), fan
        )
        progress.close()
        if plan.node_peer:
            cmd, why = await trio.to_thread.run_sync(ensure_node_peer)
            if cmd is None:
                out["node_ws_fanout"] = {"skipped": why}
            else:
                progress.phase("baseline node ws", 1)
                out["node_ws_fanout"] = await trio.to_thread.run_sync(run_fanout_server, cmd, fan)
                progress.close()
    return out
