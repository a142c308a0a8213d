"""Bytes in, frames out; frames in, bytes out. No I/O.

One decoder and one encoder are built once and reused (msgspec perf tips).
Hostile input raises :class:`FrameError` only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import inspect

from protocol.errors import ErrorCode, FrameError
from protocol.frames import CLIENT_FRAME_TYPES, ClientFrame, ErrorFrame, Pong
from protocol.text import TextKind, problem_finder

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
    a known frame with a missing or ill-typed field, or a string that
    breaks :mod:`protocol.text`'s rule for its kind → ``validation_failed``
    carrying the request id when one could be read and the field's path.
    """
    try:
        frame = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _diagnose(data, str(exc)) from None
    except msgspec.DecodeError:
        raise FrameError(ErrorCode.BAD_FRAME, "frame is not valid JSON") from None
    except RecursionError:
        # msgspec refuses nesting deeper than its limit (even in ignored fields).
        raise _diagnose(data, "frame nests too deeply") from None
    _check_text(frame)
    return frame


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


# ---------------------------------------------------------------- the text rule

# Checks one decoded value: None, or (the path below it, the problem).
_Check = Callable[[Any], tuple[str, str] | None]


def _check_text(frame: Any) -> None:
    """Every string of a decoded frame against its kind (``TextKind.KEY``
    unless its field's ``Meta(extra={"text": …})`` says otherwise). A string
    request id that breaks the rule is still echoed: every request is answered
    with its own id, and an id is only ever encoded back."""
    refused = _FRAME_CHECKS[type(frame)](frame)
    if refused is not None:
        path = "$" + refused[0]
        raise FrameError(
            ErrorCode.VALIDATION_FAILED,
            f"{refused[1]} - at `{path}`",
            request_id=getattr(frame, "id", None),
            path=path,
        )


def _checker(info: inspect.Type, kind: TextKind = TextKind.KEY) -> _Check | None:
    """How to check the strings of a value of type ``info``; None when it holds none."""
    if isinstance(info, inspect.Metadata):
        text = (info.extra or {}).get("text")
        return _checker(info.type, TextKind(text) if text else kind)
    if isinstance(info, inspect.StrType):
        return _string_checker(kind)
    if isinstance(info, inspect.ListType):
        return _list_checker(info)
    if isinstance(info, inspect.DictType):
        return _dict_checker(info)
    if isinstance(info, inspect.UnionType):
        return _union_checker(info)
    if isinstance(info, inspect.StructType):
        return _struct_checker(info)
    return None


def _string_checker(kind: TextKind) -> _Check:
    find = problem_finder(kind)

    def check(value: str) -> tuple[str, str] | None:
        problem = find(value)
        return None if problem is None else ("", problem)

    return check


def _list_checker(info: inspect.ListType) -> _Check | None:
    item = _checker(info.item_type)
    if item is None:
        return None

    def check(value: list[Any]) -> tuple[str, str] | None:
        for i, element in enumerate(value):
            if (refused := item(element)) is not None:
                return f"[{i}]{refused[0]}", refused[1]
        return None

    return check


def _dict_checker(info: inspect.DictType) -> _Check | None:
    key = _checker(info.key_type)
    item = _checker(info.value_type)
    if key is None and item is None:
        return None

    def check(value: dict[Any, Any]) -> tuple[str, str] | None:
        for name, element in value.items():
            # A bad key is reported at the object: it cannot name itself safely.
            if key is not None and (refused := key(name)) is not None:
                return "", refused[1]
            if item is not None and (refused := item(element)) is not None:
                return f".{name}{refused[0]}", refused[1]
        return None

    return check


def _union_checker(info: inspect.UnionType) -> _Check | None:
    arms: list[tuple[type, _Check]] = []
    for arm in info.types:
        check = _checker(arm)
        if check is not None:
            arms.append((_python_type(arm), check))
    if not arms:
        return None

    def check_union(value: Any) -> tuple[str, str] | None:
        for python_type, check in arms:
            if isinstance(value, python_type):
                return check(value)
        return None

    return check_union


def _python_type(info: inspect.Type) -> type:
    while isinstance(info, inspect.Metadata):
        info = info.type
    if isinstance(info, inspect.StructType):
        return info.cls
    return {
        inspect.StrType: str,
        inspect.ListType: list,
        inspect.DictType: dict,
    }[type(info)]


def _struct_checker(info: inspect.StructType, skip: frozenset[str] = frozenset()) -> _Check | None:
    fields = [
        (field.name, "." + field.encode_name, check)
        for field in info.fields
        if field.name not in skip and (check := _checker(field.type)) is not None
    ]
    if not fields:
        return None

    def check_struct(value: Any) -> tuple[str, str] | None:
        for name, wire_name, check in fields:
            element = getattr(value, name)
            if element is not None and (refused := check(element)) is not None:
                return wire_name + refused[0], refused[1]
        return None

    return check_struct


def _frame_checks() -> dict[type, _Check]:
    checks: dict[type, _Check] = {}
    union = inspect.type_info(ClientFrame)
    assert isinstance(union, inspect.UnionType)
    for arm in union.types:
        assert isinstance(arm, inspect.StructType)
        checks[arm.cls] = _struct_checker(arm) or _nothing_to_check
    # A client's pong is dropped unread: nothing in it is used or answered.
    checks[Pong] = _nothing_to_check
    return checks


def _nothing_to_check(value: Any) -> None:
    return None


_FRAME_CHECKS = _frame_checks()
