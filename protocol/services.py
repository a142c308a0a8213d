"""Service account frames (docs/services.md).

Kept apart from :mod:`protocol.frames`, whose unions name them; the shapes
follow the same rules (camelCase on the wire, tag field ``type``). No I/O.
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

RequestId = int | str
Handle = Annotated[str, Meta(min_length=1, max_length=64)]
ShortText = Annotated[str, Meta(min_length=1, max_length=256)]
ClientMessageId = Annotated[str, Meta(min_length=1, max_length=200)]
CONTENT: dict[str, Any] = {"text": "content"}


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


class ServicePost(_Frame, tag="servicePost"):
    """Post as service ``service`` (its handle): for the service's managers only.

    The message's author, and the subject its ``clientMessageId`` is
    idempotent for, is the service; the manager is recorded as
    ``metadata.authorisedBy``, with the service's managers at the time as
    ``metadata.managers`` (both shown to the service and those managers only),
    and in ``explain``. ``target`` defaults to the
    service's own conversation (``scope:<id>``); it may also name a channel
    the service has been added to. The reply's ``result`` is a send's.
    """

    id: RequestId
    service: Handle
    content: Annotated[str, Meta(extra=CONTENT)]
    client_message_id: ClientMessageId
    target: ShortText | None = None
    explain: bool = False


def results() -> dict[str, Any]:
    """Each service op's reply ``result``, for docs/protocol.md."""
    return {
        "servicePost": (
            "a `send`'s result (`sent`, or `already_sent` for a replayed"
            " `clientMessageId`), the message authored by the service; with `explain`, also"
            " `authorisedBy` (the manager) and `author` (the service). `forbidden` unless the"
            " caller is a human manager of the service; `not_found` at `$.service` for a"
            " handle that names no service of the workspace. See [services.md](services.md)."
        ),
    }
