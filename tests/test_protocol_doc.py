"""``docs/protocol.md`` is the rendering of the frames (``python -m protocol.docgen``)."""

from __future__ import annotations

from pathlib import Path

from protocol import docgen

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def test_every_request_code_and_close_is_documented() -> None:
    docgen.check_complete()


def test_protocol_doc_is_current() -> None:
    assert DOC.read_text() == docgen.render(), (
        "docs/protocol.md is stale: regenerate it with "
        "`python -m protocol.docgen > docs/protocol.md`"
    )
