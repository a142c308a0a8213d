"""Attachments (docs/design.md#attachments): upload, claim by a send, download
through the readable predicate, limits, release and sweep.

The in-process tests run a node in the test's trio loop; the limit and memory
tests run ``scopenode serve`` as a subprocess, so that its resident memory is
the node's alone (``/proc/<pid>/status``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.send_rules import attachment_error
from node.attachments import content_disposition
from node.client import AttachmentError, ClientError
from node.client.attachments import http_base
from storage import attachments
from storage.blobs import FilesystemBlobStore
from storage.pg import connect
from tests.nodes import World, make_channel, running_node
from tests.test_crash_recovery import serve_subprocess

MiB = 1024 * 1024
TIMEOUT = 30


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def raw_exchange(port: int, head: bytes, body: bytes) -> tuple[bytes, bool]:
    """Send ``head`` and then ``body`` (in pieces) while reading the answer;
    returns (answer, whether the whole body went out before it came)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    answer = b""
    finished = False
    async with stream:
        await stream.send_all(head)

        async def send() -> None:
            nonlocal finished
            try:
                for start in range(0, len(body), 64 * 1024):
                    await stream.send_all(body[start : start + 64 * 1024])
                finished = True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                while b"\r\n\r\n" not in answer:
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    answer += data
                nursery.cancel_scope.cancel()
    return answer, finished


def test_ids_that_cannot_be_uploads_are_refused_without_a_lookup() -> None:
    assert attachment_error([]) is None
    assert attachment_error(["att_a", "att_b"]) is None
    bad = attachment_error(["att_a", "upl_1"])
    assert bad is not None
    assert bad.path == "$.attachmentIds[1]"
    twice = attachment_error(["att_a", "att_a"])
    assert twice is not None
    assert twice.path == "$.attachmentIds[1]"


def test_content_disposition_names_any_file_safely() -> None:
    header = content_disposition('résumé "final".pdf')
    assert header.startswith('attachment; filename="r_sum_ _final_.pdf"')
    assert "filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22.pdf" in header


async def test_upload_send_download_and_who_may_read(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob, carl, dave = [await world.member(h) for h in ("ann", "bob", "carl", "dave")]
        payload = os.urandom(10 * MiB)
        async with (
            world.client(ann) as a,
            world.client(bob) as b,
            world.client(carl) as c,
            world.client(dave) as d,
        ):
            scope_id = await make_channel(a, "room", b, d)
            uploaded = await a.upload(payload, "big.bin", "application/x-test")
            assert uploaded["size"] == len(payload)
            assert uploaded["name"] == "big.bin"
            assert uploaded["contentType"] == "application/x-test"
            att = uploaded["attachmentId"]
            assert att.startswith("att_")
            # Unclaimed: its uploader alone reads it.
            assert sha(await a.download(att)) == sha(payload)
            with pytest.raises(AttachmentError) as caught:
                await b.download(att)
            assert caught.value.status == 404

            # Someone else's upload, an unknown one: validation_failed, nothing stored.
            with pytest.raises(ClientError) as refused:
                await b.send("#room", "mine now", attachmentIds=[att])
            assert refused.value.code == "validation_failed"
            assert refused.value.details.get("path") == "$.attachmentIds[0]"
            with pytest.raises(ClientError) as refused:
                await a.send("#room", "ghost", attachmentIds=["att_nothing"])
            assert refused.value.details.get("path") == "$.attachmentIds[0]"

            sent = await a.send("#room", "the file", attachmentIds=[att], clientMessageId="m1")
            assert sent["state"] == "sent"
            # A retry of the same send is the same send; a second message is refused it.
            again = await a.send("#room", "the file", attachmentIds=[att], clientMessageId="m1")
            assert again["state"] == "already_sent"
            with pytest.raises(ClientError) as refused:
                await a.send("#room", "again", attachmentIds=[att], clientMessageId="m2")
            assert refused.value.code == "validation_failed"

            expected = {
                "id": att,
                "name": "big.bin",
                "contentType": "application/x-test",
                "size": len(payload),
                "url": f"/v1/attachments/{att}",
            }
            events = await b.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "the file",
                timeout=TIMEOUT,
            )
            assert events[-1]["message"]["attachments"] == [expected]
            page = await b.history("#room")
            [message] = [m for m in page["messages"] if m["content"] == "the file"]
            assert message["attachments"] == [expected]
            assert "attachments" not in message["metadata"]

            assert sha(await b.download(att)) == sha(payload)
            target = tmp_path / "copy.bin"
            assert await d.download(att, target) == len(payload)
            assert sha(target.read_bytes()) == sha(payload)
            with pytest.raises(AttachmentError) as caught:
                await c.download(att)  # never a member
            assert caught.value.status == 404
            await d.request("leave", scopeId=scope_id)
            with pytest.raises(AttachmentError) as caught:
                await d.download(att)  # a former member
            assert caught.value.status == 404
            with pytest.raises(AttachmentError) as caught:
                await c.download("att_unknown")
            assert caught.value.status == 404

        # Bad token; headers of a download.
        base = http_base(node.url)
        with pytest.raises(AttachmentError) as caught:
            await attachments_upload(base, "nope", b"x")
        assert (caught.value.status, caught.value.code) == (401, "unauthorized")
        head, _ = await raw_exchange(
            node.services.port,
            f"GET /v1/attachments/{att} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {bob.token}\r\nConnection: close\r\n\r\n".encode(),
            b"",
        )
        assert head.startswith(b"HTTP/1.1 200")
        lowered = head.lower()
        assert b"content-type: application/x-test" in lowered
        assert b"x-content-type-options: nosniff" in lowered
        assert (
            b"content-disposition: attachment; filename=\"big.bin\"; filename*=utf-8''big.bin"
            in (lowered)
        )


async def attachments_upload(base: str, token: str, data: bytes) -> dict[str, Any]:
    from node.client.attachments import upload

    return await upload(base, token, data, "x.txt", "text/plain")


async def test_release_and_sweep_keep_shared_bytes(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob = await world.member("ann"), await world.member("bob")
        data = b"same bytes"
        async with world.client(ann) as a, world.client(bob) as b:
            await make_channel(a, "room", b)
            first = (await a.upload(data, "one.txt", "text/plain"))["attachmentId"]
            second = (await a.upload(data, "two.txt", "text/plain"))["attachmentId"]
            sent = await a.send("#room", "one", attachmentIds=[first])
            blobs = FilesystemBlobStore(node.services.settings.attachments_path)
            digest = sha(data)
            assert await blobs.exists(digest)
            async with await connect(database_url, autocommit=True) as conn:
                assert await attachments.release_attachments(conn, sent["messageId"]) == 1
            with pytest.raises(AttachmentError):
                await b.download(first)
            # Deleting a message makes its files unreadable at once.
            third = (await a.upload(b"gone", "gone.txt", "text/plain"))["attachmentId"]
            doomed = await a.send("#room", "doomed", attachmentIds=[third])
            assert await b.download(third) == b"gone"
            await a.delete(doomed["messageId"])
            with pytest.raises(AttachmentError):
                await b.download(third)
            async with await connect(database_url, autocommit=True) as conn:
                # The delete released the upload already: nothing left to release.
                assert await attachments.release_attachments(conn, doomed["messageId"]) == 0
                # Released rows go; the unclaimed one is not yet a day old.
                assert await attachments.sweep(conn, blobs) == 2
                assert await attachments.get(conn, first) is None
                assert await blobs.exists(digest)  # `second` still names the bytes
                assert await attachments.sweep(conn, blobs, ttl=timedelta(0)) == 1
                assert await attachments.get(conn, second) is None
            assert not await blobs.exists(digest)


# ------------------------------------------------------------- a real process


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


async def test_limits_and_memory_of_a_node_process(database_url: str, tmp_path: Path) -> None:
    async with serve_subprocess(tmp_path / "data", database_url, tmp_path / "node.log") as proc:
        world = World(proc, "")  # type: ignore[arg-type]
        async with await connect(database_url, autocommit=True) as conn:
            from storage import directory

            world.workspace_id = await directory.create_workspace(conn, "limits")
        ann = await world.member("ann")
        pid, port = proc.proc.pid, proc.port
        base = f"http://127.0.0.1:{port}"
        auth = f"Authorization: Bearer {ann.token}\r\n"

        # Over the limit by Content-Length: answered before the body is sent.
        body = b"\0" * (2 * MiB)
        head = (
            f"POST /v1/attachments?name=big HTTP/1.1\r\nHost: x\r\n{auth}"
            f"Content-Length: {26 * MiB}\r\n\r\n"
        ).encode()
        answer, finished = await raw_exchange(port, head, body)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"code": "payload_too_large"' in answer
        # Chunked: the node stops reading at the limit; the client never finishes.
        chunk = b"\1" * MiB
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(26)) + b"0\r\n\r\n"
        head = (
            f"POST /v1/attachments?name=big HTTP/1.1\r\nHost: x\r\n{auth}"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        answer, finished = await raw_exchange(port, head, chunked + body * 20)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert not finished

        # A 25 MiB upload streams: the node's resident memory barely moves.
        from node.client.attachments import download, upload

        source = tmp_path / "25.bin"
        source.write_bytes(os.urandom(25 * MiB))
        before = vm_kib(pid, "VmRSS")
        hwm_before = vm_kib(pid, "VmHWM")
        peak = before
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, vm_kib(pid, "VmRSS"))
                done.wait(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            uploaded = await upload(base, ann.token, source, content_type="application/zip")
        finally:
            done.set()
            sampler.join()
        peak = max(peak, vm_kib(pid, "VmRSS"))
        assert uploaded["size"] == 25 * MiB
        growth_mib = (peak - before) / 1024
        assert growth_mib < 8, f"node RSS grew by {growth_mib:.1f} MiB during a 25 MiB upload"
        # The kernel's own high-water mark agrees (no spike between samples).
        assert vm_kib(pid, "VmHWM") < max(hwm_before, before + 8 * 1024)
        copy = await download(base, ann.token, uploaded["attachmentId"])
        assert sha(copy) == sha(source.read_bytes())
