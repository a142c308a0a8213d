"""The sans-IO protocol layer: decoding hostile frames, codes, encoding."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.codec import decode_client_frame, encode, encode_error
from protocol.errors import CloseCode, ErrorCode, FrameError
from protocol.frames import CLIENT_FRAME_TYPES, Hello, SendResult, to_builtins


def test_error_and_close_codes_are_unique_and_close_codes_are_application_range() -> None:
    assert len({c.value for c in ErrorCode}) == len(ErrorCode)
    assert len({c.value for c in CloseCode}) == len(CloseCode)
    app = [c for c in CloseCode if c not in (CloseCode.NORMAL, CloseCode.INTERNAL_ERROR)]
    assert all(4000 <= c <= 4999 for c in app)
    assert {c for c in ErrorCode if c.retryable} >= {ErrorCode.OVERLOADED, ErrorCode.UNAVAILABLE}


def test_hello_and_send_decode_with_camel_case_fields() -> None:
    hello = decode_client_frame(
        b'{"type":"hello","token":"t","client":{"kind":"daemon"},"resume":{"scp_1":4}}'
    )
    assert isinstance(hello, Hello)
    assert hello.resume == {"scp_1": 4}
    send = decode_client_frame(
        '{"type":"send","id":"a","target":"#g","content":"x","clientMessageId":"c",'
        '"freshness":{"targetKey":"scp_1","seenUpToSeq":0}}'
    )
    assert send.freshness is not None  # type: ignore[union-attr]
    assert send.freshness.seen_up_to_seq == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[1,2]", b'"text"', b'{"type":"nope","id":1}', b'{"id":1}', b'{"type":7}'],
)
def test_not_json_or_unknown_type_is_bad_frame_without_id(raw: bytes) -> None:
    with pytest.raises(FrameError) as caught:
        decode_client_frame(raw)
    assert caught.value.code is ErrorCode.BAD_FRAME
    assert caught.value.request_id is None


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (
            b'{"type":"send","id":3,"target":"#g","content":"x","clientMessageId":"c",'
            b'"freshness":{"targetKey":"k","seenUpToSeq":"1"}}',
            "$.freshness.seenUpToSeq",
        ),
        (b'{"type":"history","id":3,"target":"#g","limit":1000}', "$.limit"),
        (b'{"type":"markRead","id":3,"scopeId":"s","seq":-1}', "$.seq"),
        (b'{"type":"createChannel","id":3,"slug":"Bad Slug","name":"x"}', "$.slug"),
    ],
)
def test_ill_typed_field_names_its_path_and_keeps_the_id(raw: bytes, path: str) -> None:
    with pytest.raises(FrameError) as caught:
        decode_client_frame(raw)
    assert caught.value.code is ErrorCode.VALIDATION_FAILED
    assert caught.value.request_id == 3
    assert caught.value.details["path"] == path


@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_frame_error(raw: bytes) -> None:
    with contextlib.suppress(FrameError):
        decode_client_frame(raw)


@given(
    st.dictionaries(
        st.sampled_from(["type", "id", "target", "content", "clientMessageId", "freshness"]),
        st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=8),
            st.sampled_from(sorted(CLIENT_FRAME_TYPES)),
        ),
    )
)
def test_arbitrary_objects_decode_or_raise_frame_error(obj: dict[str, object]) -> None:
    with contextlib.suppress(FrameError):
        decode_client_frame(msgspec.json.encode(obj))


def test_send_result_omits_fields_of_other_states() -> None:
    held = SendResult(
        state="held",
        target_key="scp_1",
        client_message_id="c",
        latest_seq=5,
        seen_up_to_seq=3,
        needs_refresh_until_seq=5,
    )
    assert to_builtins(held) == {
        "state": "held",
        "targetKey": "scp_1",
        "clientMessageId": "c",
        "latestSeq": 5,
        "seenUpToSeq": 3,
        "needsRefreshUntilSeq": 5,
    }


def test_error_frames_carry_retryable_and_no_raw_newlines() -> None:
    frame = msgspec.json.decode(encode_error(None, ErrorCode.UNAVAILABLE, "line\nbreak"))
    assert frame == {
        "type": "error",
        "id": None,
        "code": "unavailable",
        "message": "line\nbreak",
        "retryable": True,
        "details": {},
    }
    assert b"\n" not in encode({"text": "a\nb"})
