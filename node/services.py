"""What every session needs from the node, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.moderation import KeywordList
from node.config import Settings
from node.hub import Hub
from node.limits import AddressLimiter, Limiter
from node.metrics import Metrics
from node.presence import PresenceBoard
from node.registry import ActorRegistry
from node.resolver import Resolver
from node.upload_gate import UploadGate
from storage.pool import Pool


@dataclass(slots=True)
class Services:
    settings: Settings
    node_id: str
    pool: Pool
    registry: ActorRegistry
    hub: Hub
    metrics: Metrics
    resolver: Resolver
    # Rate-limit buckets by member and by workspace (node/limits.py).
    limiter: Limiter
    # Invite lookups and redemptions by client address (node/invites.py).
    invite_limiter: AddressLimiter
    accepting: bool = True
    draining: bool = False
    ready: bool = False
    port: int = 0
    metrics_port: int | None = None  # the --metrics-bind listener's, when there is one
    sessions: set[Any] = field(default_factory=set)
    worker: Any = None
    # The scheduler loop (node/scheduler.py), once the node runs it.
    scheduler: Any = None
    # Swapped whole on SIGHUP (node/app.py); sends read it without a lock.
    moderation: KeywordList = field(default_factory=KeywordList)
    uploads: UploadGate = field(default_factory=UploadGate)
    # Who is online here, from the hub's sessions (node/presence.py).
    presence: PresenceBoard = field(init=False)

    def __post_init__(self) -> None:
        self.presence = PresenceBoard(self.hub, self.settings.presence_idle_s)

    def scheduler_wake(self) -> None:
        """A schedule changed here: the scheduler looks again now, not at its next nap's end."""
        if self.scheduler is not None:
            self.scheduler.wake()
