"""The scopenode client library: one WebSocket session, and an agent daemon on top.

Read in this order:

* ``connection.py`` — :func:`open_client` and :class:`Client`: hello/welcome,
  requests and replies, the event queue, close codes. Frames are plain dicts.
* ``frontier.py`` — :class:`Frontier` (what the agent runtime has seen, per
  targetKey) and :class:`Delivery` (one ``deliver`` event). Pure.
* ``daemon.py`` — :func:`open_daemon` and :class:`DaemonClient`: wakes,
  stale-delivery suppression, acks, fresh sends, and :meth:`DaemonClient.reply`,
  which answers a delivery, handles ``held`` and only then acknowledges.
* ``reconnect.py`` — :func:`open_reconnecting_client` and ``open_daemon(...,
  reconnect=Backoff())``: reconnect with jittered backoff, resume, and hand
  each event and delivery over once; which closes end the loop.
* ``chunks.py`` — how a long send is stored as rows, and reading them back.
* ``cards.py`` — share cards and a service's interactive cards (``Client.share_channel``,
  ``Client.post_card``, ``Client.update_card`` …), one request each.
* ``attachments.py`` — uploads and downloads over HTTP (``Client.upload``,
  ``Client.download``), streamed both ways.

``docs/agents.md`` is the guide for daemon authors, ``docs/protocol.md`` the
wire reference, and ``examples/echo_agent.py`` a whole agent.
"""

from node.client.attachments import AttachmentError
from node.client.chunks import (
    CHUNK_SEPARATOR,
    ChunkInfo,
    chunk_client_message_id,
    chunk_info,
    join_chunks,
)
from node.client.connection import (
    Client,
    ClientError,
    ConnectionClosed,
    ProtocolViolation,
    open_client,
)
from node.client.daemon import (
    DAEMON_CAPABILITIES,
    REPLY_ATTEMPTS,
    DaemonClient,
    Replied,
    ReplyNotSent,
    Revise,
    open_daemon,
    reply_client_message_id,
)
from node.client.frontier import Delivery, Frontier
from node.client.reconnect import (
    RETRYABLE_CLOSE_CODES,
    Backoff,
    ReconnectGaveUp,
    ReconnectingClient,
    SessionEnded,
    is_retryable,
    open_reconnecting_client,
)

__all__ = [
    "CHUNK_SEPARATOR",
    "DAEMON_CAPABILITIES",
    "REPLY_ATTEMPTS",
    "RETRYABLE_CLOSE_CODES",
    "AttachmentError",
    "Backoff",
    "ChunkInfo",
    "Client",
    "ClientError",
    "ConnectionClosed",
    "DaemonClient",
    "Delivery",
    "Frontier",
    "ProtocolViolation",
    "ReconnectGaveUp",
    "ReconnectingClient",
    "Replied",
    "ReplyNotSent",
    "Revise",
    "SessionEnded",
    "chunk_client_message_id",
    "chunk_info",
    "is_retryable",
    "join_chunks",
    "open_client",
    "open_daemon",
    "open_reconnecting_client",
    "reply_client_message_id",
]
