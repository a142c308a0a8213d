"""What every workload against a node shares: environment, results, CPU window."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bench.client import EventHandler, Session, open_session, ws_url
from bench.nodeproc import NodeUnderTest
from bench.progress import Progress
from bench.provision import Member, Provisioner
from bench.stats import Latency, MachineCpu, own_cpu_s, proc_cpu_s


@dataclass
class CpuWindow:
    """Generator, node and whole-machine CPU spent inside the measured window."""

    node_pid: int | None
    generator_cpu_s: float = 0.0
    node_cpu_s: float | None = None
    machine: dict[str, float] | None = None
    _g0: float = 0.0
    _n0: float | None = None
    _machine: MachineCpu | None = None

    def start(self) -> None:
        self._g0 = own_cpu_s()
        self._n0 = proc_cpu_s(self.node_pid) if self.node_pid else None
        self._machine = MachineCpu()

    def stop(self, extra_generator_cpu_s: float = 0.0) -> None:
        self.generator_cpu_s = round(own_cpu_s() - self._g0 + extra_generator_cpu_s, 3)
        if self.node_pid and self._n0 is not None:
            n1 = proc_cpu_s(self.node_pid)
            self.node_cpu_s = round(n1 - self._n0, 3) if n1 is not None else None
        if self._machine is not None:
            self.machine = self._machine.stop()


@dataclass
class WorkloadResult:
    results: dict[str, Any]
    cpu: CpuWindow
    latencies: list[Latency] = field(default_factory=list)


@dataclass
class Env:
    node: NodeUnderTest
    provisioner: Provisioner
    seed: int
    progress: Progress
    reader_processes: int = 2
    timeout_s: float = 120.0
    members_cap: int = 16
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def host_port(self) -> tuple[str, int]:
        u = urlsplit(self.node.base_url)
        return u.hostname or "127.0.0.1", u.port or 80

    def url(self, workspace_id: str) -> str:
        return ws_url(self.node.base_url, workspace_id)

    def cpu_window(self) -> CpuWindow:
        return CpuWindow(self.node.pid)

    async def workspace(self, prefix: str) -> str:
        suffix = f"{self.seed}-{self.rng.randrange(16**6):06x}"
        return await self.provisioner.create_workspace(f"{prefix}-{suffix}")

    async def members(
        self, workspace_id: str, member_type: str, prefix: str, n: int
    ) -> list[Member]:
        handles = [f"{prefix}{i}" for i in range(n)]
        self.progress.phase(f"provision {prefix}", n)
        members = await self.provisioner.create_members(workspace_id, member_type, handles)
        self.progress.update(n, force=True)
        self.progress.close()
        return members


async def join_each_member(sessions: Sequence[Session], scope_id: str) -> None:
    """Join ``scope_id`` once per member among ``sessions`` (a membership is the
    member's, whichever of its sessions asks)."""
    joined: set[str] = set()
    for s in sessions:
        if s.member_id not in joined:
            await s.request("join", scopeId=scope_id)
            joined.add(s.member_id)


async def create_channel(session: Session, slug: str) -> str:
    result = await session.request("createChannel", slug=slug, name=slug, visibility="public")
    return str(result["scopeId"])


@asynccontextmanager
async def open_sessions(
    url: str,
    tokens: list[str],
    *,
    kind: str,
    capabilities: list[str] | None = None,
    progress: Progress | None = None,
    handlers: Sequence[EventHandler] | None = None,
) -> AsyncIterator[list[Session]]:
    """Open one session per token, one after another (a context stack owned by this task).

    ``handlers[i]``, when given, receives session ``i``'s events.
    """
    async with AsyncExitStack() as stack:
        sessions: list[Session] = []
        for i, token in enumerate(tokens):
            on_event = handlers[i] if handlers else None
            cm = open_session(url, token, kind=kind, capabilities=capabilities, on_event=on_event)
            sessions.append(await stack.enter_async_context(cm))
            if progress is not None:
                progress.update(len(sessions))
        yield sessions


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)
