"""Bytes in, frames out; frames in, bytes out. No I/O.

One decoder and one encoder are built once and reused (msgspec perf tips).
Hostile input raises :class:`FrameError` only.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from protocol.errors import ErrorCode, FrameError
from protocol.frames import CLIENT_FRAME_TYPES, ClientFrame, ErrorFrame

_decoder: msgspec.json.Decoder[ClientFrame] = msgspec.json.Decoder(ClientFrame)
_encoder = msgspec.json.Encoder()
_PATH = re.compile(r"at `(\$[^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


class _Envelope(msgspec.Struct):
    type: Any = None
    id: Any = None


_envelope_decoder = msgspec.json.Decoder(_Envelope)


def decode_client_frame(data: bytes | str) -> ClientFrame:
    """Decode one client frame or raise :class:`FrameError`.

    Not JSON, not an object, nested deeper than msgspec decodes, or no known
    ``type`` → ``bad_frame`` (id null);
    a known frame with a missing or ill-typed field → ``validation_failed``
    carrying the request id when one could be read and the field's path.
    """
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _diagnose(data, str(exc)) from None
    except msgspec.DecodeError:
        raise FrameError(ErrorCode.BAD_FRAME, "frame is not valid JSON") from None
    except RecursionError:
        # msgspec refuses nesting deeper than its limit (even in ignored fields).
        raise _diagnose(data, "frame nests too deeply") from None


def _diagnose(data: bytes | str, message: str) -> FrameError:
    try:
        envelope = _envelope_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return FrameError(ErrorCode.BAD_FRAME, "frame must be a JSON object")
    except RecursionError:
        return FrameError(ErrorCode.BAD_FRAME, "frame nests too deeply")
    if not isinstance(envelope.type, str) or envelope.type not in CLIENT_FRAME_TYPES:
        return FrameError(ErrorCode.BAD_FRAME, f"unknown frame type {envelope.type!r}")
    request_id = envelope.id
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        request_id = None
    match = _PATH.search(message)
    path = match.group(1) if match else None
    if missing := _MISSING.search(message):
        # msgspec gives the path of the object missing it (none at the top level).
        path = f"{path or '$'}.{missing.group(1)}"
    return FrameError(ErrorCode.VALIDATION_FAILED, message, request_id=request_id, path=path)


def encode(frame: Any) -> bytes:
    """Encode a server frame (a Struct, or plain builtins) as compact JSON."""
    return _encoder.encode(frame)


def encode_error(
    request_id: int | str | None,
    code: ErrorCode,
    message: str,
    details: dict[str, Any] | None = None,
) -> bytes:
    return _encoder.encode(
        ErrorFrame(
            id=request_id,
            code=code.value,
            message=message,
            retryable=code.retryable,
            details=details or {},
        )
    )
