"""The load generator's session decodes what a request waits for and skips
the rest when nobody listens to events."""

from __future__ import annotations

from bench.client import worth_decoding
from protocol.codec import encode
from protocol.frames import ErrorFrame, Reply

REPLY = encode(Reply(id=7, op="send", result={"state": "sent"})).decode()
ERROR = encode(ErrorFrame(id=7, code="forbidden", message="no", retryable=False)).decode()
EVENT = '{"type":"message","scopeId":"s","message":{"seq":1}}'


def test_replies_and_errors_are_decoded_without_a_listener() -> None:
    assert worth_decoding(REPLY, listening=False)
    assert worth_decoding(ERROR, listening=False)


def test_events_are_skipped_without_a_listener_and_decoded_with_one() -> None:
    assert not worth_decoding(EVENT, listening=False)
    assert worth_decoding(EVENT, listening=True)


def test_a_line_of_another_shape_is_decoded_and_an_empty_one_is_not() -> None:
    assert worth_decoding('{"id":7,"type":"reply"}', listening=False)
    assert not worth_decoding("", listening=True)
