"""Node settings (CLI flags and environment)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from actors.moderation import KeywordList, parse_keyword_file
from actors.scope_state import ROW_LIMIT
from node.limits import (
    INVITE_BURST_ENV,
    INVITE_RATE_ENV,
    MAX_SESSIONS_ENV,
    READ_BURST_ENV,
    READ_RATE_ENV,
    READS_AT_ONCE_ENV,
    REQUEST_BURST_ENV,
    REQUEST_RATE_ENV,
    SEND_BURST_ENV,
    SEND_RATE_ENV,
    WORKSPACE_READ_BURST_ENV,
    WORKSPACE_READ_RATE_ENV,
    WORKSPACE_REQUEST_BURST_ENV,
    WORKSPACE_REQUEST_RATE_ENV,
    WORKSPACE_SEND_BURST_ENV,
    WORKSPACE_SEND_RATE_ENV,
    AddressLimiter,
    Limiter,
    Rate,
    Rates,
    env_float,
    env_int,
)
from node.outbox_worker import WorkerSettings

MAX_ATTACHMENT_BYTES = 25 * 1024 * 1024
UPLOAD_IDLE_TIMEOUT_ENV = "SCOPENODE_UPLOAD_IDLE_TIMEOUT"
UPLOAD_GRACE_ENV = "SCOPENODE_UPLOAD_GRACE"
UPLOAD_MIN_RATE_ENV = "SCOPENODE_UPLOAD_MIN_RATE"
UPLOADS_PER_MEMBER_ENV = "SCOPENODE_UPLOADS_PER_MEMBER"
UPLOAD_RATE_ENV = "SCOPENODE_UPLOAD_RATE"
UPLOAD_BURST_ENV = "SCOPENODE_UPLOAD_BURST"
UPLOAD_QUOTA_ENV = "SCOPENODE_UPLOAD_QUOTA"
MEMORY_CEILING_ENV = "SCOPENODE_MEMORY_CEILING_MB"
METRICS_TOKEN_ENV = "SCOPENODE_METRICS_TOKEN"
SEARCH_LANGUAGE_ENV = "SCOPENODE_SEARCH_LANGUAGE"


@dataclass(frozen=True, slots=True)
class UploadSettings:
    """What one member may upload through one node (docs/security.md#uploads).

    Far above a person attaching files or an agent posting its output; each
    is read from the environment when the node starts.
    """

    # A body that sends nothing for this long is cut (408).
    idle_timeout: float = field(default_factory=lambda: env_float(UPLOAD_IDLE_TIMEOUT_ENV, 30.0))
    # The overall deadline: after ``grace`` seconds an upload must have
    # averaged ``min_rate`` bytes per second, so it ends by
    # grace + received / min_rate (27 minutes for 25 MiB).
    grace: float = field(default_factory=lambda: env_float(UPLOAD_GRACE_ENV, 30.0))
    min_rate: int = field(default_factory=lambda: env_int(UPLOAD_MIN_RATE_ENV, 16 * 1024))
    # Uploads of one member in progress on this node at once (429 above).
    per_member: int = field(default_factory=lambda: env_int(UPLOADS_PER_MEMBER_ENV, 16))
    # A byte bucket per member on this node: bytes per second, bucket size.
    rate: int = field(default_factory=lambda: env_int(UPLOAD_RATE_ENV, 512 * 1024))
    burst: int = field(default_factory=lambda: env_int(UPLOAD_BURST_ENV, 256 * 1024 * 1024))
    # Bytes of a member's uploads no message has claimed yet, in the database.
    quota: int = field(default_factory=lambda: env_int(UPLOAD_QUOTA_ENV, 512 * 1024 * 1024))


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8765
    data_dir: Path = Path(".scopenode")
    database_url: str | None = None
    node_id: str = ""
    log_level: str = "info"
    max_frame_bytes: int = 256 * 1024
    heartbeat_ms: int = 20_000
    hello_timeout: float = 10.0
    outbound_cap_bytes: int = 4 * 1024 * 1024
    slow_consumer_grace: float = 5.0
    pool_size: int = 16
    # Group-commit lanes: concurrent send transactions, each batching many scopes
    # (0: every actor commits on its own pooled connection). Two, because one
    # left the cores idle while a commit waited for its WAL flush
    # (docs/performance.md, "Commit lanes and gathering").
    commit_lanes: int = int(os.environ.get("SCOPENODE_COMMIT_LANES", "2"))
    # How long a free lane may wait for its share of the batches the committer
    # held at once lately (0: never). One millisecond: about one sender's
    # turn-around (reply out, next request in) on a busy node
    # (docs/performance.md, "Commit lanes and gathering").
    commit_gather_ms: float = float(os.environ.get("SCOPENODE_COMMIT_GATHER_MS", "1"))
    actor_idle_timeout: float = 120.0
    # A session with no request for this long counts as idle: its member is
    # ``away`` once every session of theirs is (docs/presence.md).
    presence_idle_s: float = 300.0
    max_inflight_requests: int = 64
    # Rows a history page may examine before answering (a private reader may see
    # few of them): the page can come back short or empty with hasMore.
    history_candidate_budget: int = 1000
    moderation_keywords: tuple[str, ...] = field(default_factory=tuple)
    # One keyword or phrase per line, read at start and again on SIGHUP.
    moderation_file: Path | None = None
    outbox: WorkerSettings = field(default_factory=WorkerSettings)
    redeliver_limit: int = 1000
    # Characters per message row; longer sends become chunked logical sends.
    row_limit: int = ROW_LIMIT
    # Token buckets (tokens per second, bucket size) shared by all sessions of
    # a member: sends; every other request but ping/pong; and search and
    # history, which take from the request bucket too. Then the same three per
    # workspace, and live sessions per member on this node. Above a person
    # typing or a busy agent (docs/security.md, "Limits and revocation"); the
    # bench and the test suite raise them (node.limits.RAISED_LIMITS_ENV).
    send_rate: float = field(default_factory=lambda: env_float(SEND_RATE_ENV, 20.0))
    send_burst: int = field(default_factory=lambda: env_int(SEND_BURST_ENV, 40))
    request_rate: float = field(default_factory=lambda: env_float(REQUEST_RATE_ENV, 50.0))
    request_burst: int = field(default_factory=lambda: env_int(REQUEST_BURST_ENV, 500))
    read_rate: float = field(default_factory=lambda: env_float(READ_RATE_ENV, 10.0))
    read_burst: int = field(default_factory=lambda: env_int(READ_BURST_ENV, 20))
    workspace_send_rate: float = field(
        default_factory=lambda: env_float(WORKSPACE_SEND_RATE_ENV, 200.0)
    )
    workspace_send_burst: int = field(
        default_factory=lambda: env_int(WORKSPACE_SEND_BURST_ENV, 2000)
    )
    workspace_request_rate: float = field(
        default_factory=lambda: env_float(WORKSPACE_REQUEST_RATE_ENV, 500.0)
    )
    workspace_request_burst: int = field(
        default_factory=lambda: env_int(WORKSPACE_REQUEST_BURST_ENV, 5000)
    )
    workspace_read_rate: float = field(
        default_factory=lambda: env_float(WORKSPACE_READ_RATE_ENV, 50.0)
    )
    workspace_read_burst: int = field(
        default_factory=lambda: env_int(WORKSPACE_READ_BURST_ENV, 500)
    )
    # A member's searches and history reads running at once on this node; the
    # others wait their turn (not refused).
    reads_at_once: int = field(default_factory=lambda: env_int(READS_AT_ONCE_ENV, 2))
    max_sessions_per_member: int = field(default_factory=lambda: env_int(MAX_SESSIONS_ENV, 32))
    # Invite lookups and redemptions per client address (docs/invites.md): a
    # person joining needs two or three; a code guesser gets six a minute.
    invite_rate: float = field(default_factory=lambda: env_float(INVITE_RATE_ENV, 0.1))
    invite_burst: int = field(default_factory=lambda: env_int(INVITE_BURST_ENV, 10))
    # Where people reach the web client (``serve --public-url``); the login
    # and invite links are built from it. None: http://host:port.
    public_url: str | None = None
    # Attachment bytes (docs/design.md#attachments): content-addressed files
    # under this directory (None: <data_dir>/attachments; nodes of a cluster
    # share one), and the largest upload accepted (413 above it).
    attachments_dir: Path | None = None
    max_attachment_bytes: int = MAX_ATTACHMENT_BYTES
    uploads: UploadSettings = field(default_factory=UploadSettings)
    # Resident memory over which idle scope actors are passivated, least
    # recently used first (node/memory.py, docs/operations.md).
    memory_ceiling_mb: int = field(default_factory=lambda: env_int(MEMORY_CEILING_ENV, 512))
    # /metrics on the main port answers loopback peers only (node/http.py);
    # a scraper elsewhere gets a listener of its own at this (host, port), or
    # presents this token as ``Authorization: Bearer`` (kept out of the repr).
    metrics_bind: tuple[str, int] | None = None
    metrics_token: str | None = field(
        default_factory=lambda: os.environ.get(METRICS_TOKEN_ENV) or None, repr=False
    )
    # The text search configuration whose stems a search word also matches
    # (docs/design.md#search): any the database has; checked at start.
    search_language: str = field(
        default_factory=lambda: os.environ.get(SEARCH_LANGUAGE_ENV) or "english"
    )

    @property
    def attachments_path(self) -> Path:
        return self.attachments_dir or self.data_dir / "attachments"

    def limiter(self) -> Limiter:
        """The node's buckets, sized by these settings."""
        member = Rates(
            send=Rate(self.send_rate, self.send_burst),
            request=Rate(self.request_rate, self.request_burst),
            read=Rate(self.read_rate, self.read_burst),
        )
        workspace = Rates(
            send=Rate(self.workspace_send_rate, self.workspace_send_burst),
            request=Rate(self.workspace_request_rate, self.workspace_request_burst),
            read=Rate(self.workspace_read_rate, self.workspace_read_burst),
        )
        return Limiter(member, workspace, self.reads_at_once)

    def invite_limiter(self) -> AddressLimiter:
        return AddressLimiter(Rate(self.invite_rate, self.invite_burst))


# The rate limit fields above, by name (the session cap aside).
LIMIT_FIELDS = (
    "send_rate",
    "send_burst",
    "request_rate",
    "request_burst",
    "read_rate",
    "read_burst",
    "workspace_send_rate",
    "workspace_send_burst",
    "workspace_request_rate",
    "workspace_request_burst",
    "workspace_read_rate",
    "workspace_read_burst",
    "reads_at_once",
    "invite_rate",
    "invite_burst",
)


def with_raised_limits(settings: Settings) -> Settings:
    """``settings`` with every rate and burst at 1,000,000, as RAISED_LIMITS_ENV
    gives a node started in its own process (an in-process bench node)."""
    raised: dict[str, Any] = dict.fromkeys(LIMIT_FIELDS, 1_000_000)
    return replace(settings, **raised)


def load_moderation(settings: Settings) -> KeywordList:
    """``moderation_keywords`` and the lines of ``moderation_file`` (OSError and
    UnicodeDecodeError propagate: the caller decides whether that is fatal)."""
    keywords = list(settings.moderation_keywords)
    if settings.moderation_file is not None:
        keywords += parse_keyword_file(settings.moderation_file.read_text(encoding="utf-8"))
    return KeywordList.of(keywords)


def web_origin(host: str, port: int, public_url: str | None = None) -> str:
    """Where people open the web client: ``--public-url`` when given, else the
    address the node listens on."""
    if public_url:
        return public_url.rstrip("/")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"  # a wildcard address is not something to click
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"
