"""What one member may upload (docs/security.md#uploads), and the files on disk.

The gate (uploads at once, byte rate) is tested as plain methods; the blob
store on a temporary directory; deadlines, quota and rate through an
in-process node with small limits; the slow-upload flood and the restart
after a crash through ``scopenode serve`` subprocesses with small limits in
their environment, so that ``/proc/<pid>/fd`` counts the node's files alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trio

from node.client import AttachmentError
from node.client.attachments import download, upload
from node.config import (
    UPLOAD_GRACE_ENV,
    UPLOAD_MIN_RATE_ENV,
    UPLOADS_PER_MEMBER_ENV,
    Settings,
    UploadSettings,
)
from node.upload_gate import CONCURRENCY_RETRY, PRUNE_FLOOR, Limit, UploadGate
from storage.blobs import FilesystemBlobStore
from tests.nodes import World, make_channel, running_node
from tests.test_crash_recovery import serve_subprocess

KiB = 1024
MiB = 1024 * KiB
TIMEOUT = 30


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ------------------------------------------------------------------ the gate


def limits(**values: Any) -> UploadSettings:
    return UploadSettings(**values)


def test_a_member_holds_at_most_per_member_uploads_at_once() -> None:
    gate = UploadGate()
    caps = limits(per_member=2, rate=MiB, burst=100 * MiB)
    assert gate.admit("ann", 4096, caps, 0.0) is None
    assert gate.admit("ann", 4096, caps, 0.0) is None
    refusal = gate.admit("ann", 4096, caps, 0.0)
    assert refusal is not None
    assert (refusal.limit, refusal.wait) == (Limit.UPLOADS, CONCURRENCY_RETRY)
    assert gate.admit("bob", 4096, caps, 0.0) is None  # another member is not held up
    gate.release("ann")
    assert gate.admit("ann", 4096, caps, 0.0) is None
    assert gate.active("ann") == 2


def test_the_byte_rate_says_how_long_to_wait_and_carries_debt() -> None:
    gate = UploadGate()
    caps = limits(per_member=10, rate=1000, burst=10_000)
    assert gate.admit("ann", 8000, caps, 0.0) is None
    gate.release("ann")
    refusal = gate.admit("ann", 4000, caps, 0.0)
    assert refusal is not None
    assert refusal.limit is Limit.RATE
    assert refusal.wait == pytest.approx(2.0)  # 2,000 left, 4,000 needed, 1,000/s
    assert gate.admit("ann", 4000, caps, 2.0) is None
    # A chunked body pays as it arrives and may overdraw: the next one waits.
    gate.charge("ann", 20_000, caps, 2.0)
    gate.release("ann")
    refusal = gate.admit("ann", 1000, caps, 2.0)
    assert refusal is not None
    assert refusal.wait == pytest.approx(21.0)  # from -20,000 back to 1,000
    # Larger than the bucket: waits for a full bucket, not forever.
    refusal = gate.admit("ann", 50_000, caps, 2.0)
    assert refusal is not None
    assert refusal.wait == pytest.approx(30.0)
    assert gate.admit("ann", 50_000, caps, 32.0) is None
    # Refused before its body (the quota): what it paid comes back.
    gate.release("ann", refund=50_000)
    assert gate.admit("ann", 10_000, caps, 32.0) is None


def test_members_with_nothing_going_on_are_forgotten() -> None:
    gate = UploadGate()
    caps = limits(per_member=4, rate=1000, burst=10_000)
    for n in range(2000):
        assert gate.admit(f"m{n}", 5000, caps, 0.0) is None
        gate.release(f"m{n}")
    assert gate.admit("busy", 1, caps, 0.0) is None
    # Later, one new member a second: every bucket older than a second is
    # full again, and the map stays at the floor, with the busy member in it.
    for n in range(2000, 6000):
        assert gate.admit(f"m{n}", 1, caps, 10.0 + n) is None
        gate.release(f"m{n}")
    assert len(gate) <= PRUNE_FLOOR
    assert gate.active("busy") == 1


# ------------------------------------------------------------ files on disk


async def test_folders_are_0700_and_files_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        root = tmp_path / "data" / "attachments"
        blobs = FilesystemBlobStore(root)
        staged = await blobs.stage()
        [staging] = (root / "tmp").iterdir()
        assert mode(staging) == 0o600
        await staged.write(b"private bytes")
        digest = sha(b"private bytes")
        await blobs.put(staged, digest)
        blob = blobs.path_of(digest)
        assert mode(blob) == 0o600
        for folder in (tmp_path / "data", root, root / "tmp", root / "sha256", blob.parent):
            assert mode(folder) == 0o700, folder
        assert mode(blob.parent.parent) == 0o700
    finally:
        os.umask(old)


async def test_prepare_makes_folders_of_an_existing_store_private(tmp_path: Path) -> None:
    root = tmp_path / "attachments"
    digest = sha(b"old")
    nested = root / "sha256" / digest[:2] / digest[2:4]
    nested.mkdir(parents=True, mode=0o755)
    (root / "tmp").mkdir(mode=0o755)
    for folder in (root, root / "sha256", nested.parent, nested, root / "tmp"):
        folder.chmod(0o755)
    (nested / digest).write_bytes(b"old")
    await FilesystemBlobStore(root).prepare()
    for folder in (root, root / "sha256", nested.parent, nested, root / "tmp"):
        assert mode(folder) == 0o700, folder


async def test_the_staging_sweep_takes_what_no_upload_holds(tmp_path: Path) -> None:
    day = 24 * 3600
    blobs = FilesystemBlobStore(tmp_path)
    other = FilesystemBlobStore(tmp_path)  # another node sharing the directory
    live = await blobs.stage()
    await live.write(b"still coming")
    left = tmp_path / "tmp" / "upload-left-by-a-dead-node"
    left.write_bytes(b"x" * 1000)
    assert await other.sweep_staging(day) == 1  # the upload's lock keeps its file
    assert not left.exists()
    assert await blobs.sweep_staging(day) == 0
    await live.write(b", and done")
    await blobs.put(live, sha(b"still coming, and done"))
    assert await blobs.exists(sha(b"still coming, and done"))
    # One held past any upload's life goes, but never under its own node.
    stuck = await blobs.stage()
    [path] = (tmp_path / "tmp").iterdir()
    os.utime(path, (0, 0))
    assert await blobs.sweep_staging(3600) == 0
    assert await other.sweep_staging(3600) == 1
    await stuck.discard()
    assert list((tmp_path / "tmp").iterdir()) == []


# -------------------------------------------------------- an in-process node


def upload_head(token: str, length: int, name: str) -> bytes:
    """The head of an upload whose body the caller sends by hand."""
    return (
        f"POST /v1/attachments?name={quote(name)} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def raw_upload(
    port: int,
    token: str,
    length: int,
    pieces: list[tuple[float, bytes]],
    name: str = "slow.bin",
) -> tuple[bytes, float]:
    """POST with ``Content-Length: length`` and send ``pieces`` (pause, bytes)
    until the node answers; (answer head and body, seconds to the answer)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    head = upload_head(token, length, name)
    started = trio.current_time()
    answer = b""
    async with stream:
        await stream.send_all(head)

        async def send() -> None:
            try:
                for pause, data in pieces:
                    await trio.sleep(pause)
                    await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                while (data := await stream.receive_some(65536)) != b"":
                    answer += data
                    if _complete(answer):
                        break
                nursery.cancel_scope.cancel()
    return answer, trio.current_time() - started


def _complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def parse(answer: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}


async def test_an_upload_is_cut_when_idle_or_slower_than_the_floor(
    database_url: str, tmp_path: Path
) -> None:
    caps = UploadSettings(idle_timeout=1.0, grace=2.0, min_rate=1000)
    async with running_node(database_url, tmp_path, uploads=caps) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        port, token = node.services.port, ann.token
        idle = trickle = steady = (b"", 0.0)

        async def run_idle() -> None:
            nonlocal idle
            idle = await raw_upload(port, token, 100, [(0, b"abc")])

        async def run_trickle() -> None:
            nonlocal trickle
            # Never idle for a second, yet far below 1,000 bytes/s.
            trickle = await raw_upload(port, token, 100, [(0.3, b"x")] * 60)

        async def run_steady() -> None:
            nonlocal steady
            # 10,000 bytes/s for 3 s: past the grace, above the floor.
            steady = await raw_upload(port, token, 30_000, [(0.5, b"s" * 5000)] * 6)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_idle)
            nursery.start_soon(run_trickle)
            nursery.start_soon(run_steady)

        status, _, body = parse(idle[0])
        assert (status, body["code"]) == (408, "validation_failed"), idle
        assert "sent nothing for 1 s" in body["message"]
        assert 0.9 < idle[1] < 3
        status, _, body = parse(trickle[0])
        assert status == 408, trickle
        assert "below 1000 bytes/s" in body["message"]
        assert 1.9 < trickle[1] < 4
        status, _, body = parse(steady[0])
        assert (status, body["size"]) == (201, 30_000), steady
        assert steady[1] > 2.5
        # The cut uploads left nothing staged.
        assert list((node.services.settings.attachments_path / "tmp").iterdir()) == []


async def test_quota_is_answered_429_with_retry_after_until_uploads_are_sent(
    database_url: str, tmp_path: Path
) -> None:
    caps = UploadSettings(quota=150_000)
    async with running_node(database_url, tmp_path, uploads=caps) as node:
        world = await World.create(node)
        ann, bob = await world.member("ann"), await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b:
            await make_channel(a, "room", b)
            first = await a.upload(b"1" * 100_000, "one.bin")
            with pytest.raises(AttachmentError) as caught:
                await a.upload(b"2" * 60_000, "two.bin")
            assert (caught.value.status, caught.value.code) == (429, "rate_limited")
            answer, _ = await raw_upload(
                node.services.port, ann.token, 60_000, [(0, b"2" * 60_000)]
            )
            status, headers, body = parse(answer)
            assert status == 429
            # Room comes back when the oldest unclaimed upload expires (a day).
            assert 23 * 3600 < int(headers["retry-after"]) <= 24 * 3600
            assert body["details"]["limit"] == "quota"
            assert body["details"]["retryAfterMs"] > 23 * 3600 * 1000
            # Another member's quota is its own. Every upload counts for at
            # least 4 KiB: 5 + 100,000 + 46,000 bytes would fit, 4,096 + … not.
            await b.upload(b"small", "small.txt")
            assert (await b.upload(b"3" * 100_000, "three.bin"))["size"] == 100_000
            with pytest.raises(AttachmentError) as caught:
                await b.upload(b"4" * 46_000, "four.bin")
            assert caught.value.status == 429
            # Sending frees the sender's.
            await a.send("#room", "here", attachmentIds=[first["attachmentId"]])
            assert (await a.upload(b"2" * 60_000, "two.bin"))["size"] == 60_000
            # Over the quota on its own: it can never fit.
            answer, _ = await raw_upload(node.services.port, ann.token, 200_000, [])
            assert parse(answer)[0] == 413


async def test_byte_rate_is_answered_429_with_retry_after(
    database_url: str, tmp_path: Path
) -> None:
    caps = UploadSettings(rate=50_000, burst=150_000)
    async with running_node(database_url, tmp_path, uploads=caps) as node:
        world = await World.create(node)
        ann, bob = await world.member("ann"), await world.member("bob")
        base = node.http
        assert (await upload(base, ann.token, b"a" * 150_000, "a.bin"))["size"] == 150_000
        answer, _ = await raw_upload(node.services.port, ann.token, 100_000, [(0, b"b" * 100_000)])
        status, headers, body = parse(answer)
        assert (status, body["code"], body["details"]["limit"]) == (429, "rate_limited", "rate")
        wait_ms = body["details"]["retryAfterMs"]
        assert 0 < wait_ms <= 2000  # 100,000 bytes at 50,000/s, some already back
        assert headers["retry-after"] == str(math.ceil(wait_ms / 1000))
        # Another member has a bucket of its own.
        assert (await upload(base, bob.token, b"c" * 150_000, "c.bin"))["size"] == 150_000
        await trio.sleep(wait_ms / 1000)  # the wait advertised is enough
        assert (await upload(base, ann.token, b"b" * 100_000, "b.bin"))["size"] == 100_000


async def test_file_names_follow_the_text_rule(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        base = node.http
        for bad in ("invoice\u202egpj.exe", "a\u200bb.txt", "tab\there", "\u2066x\u2069.pdf"):
            with pytest.raises(AttachmentError) as caught:
                await upload(base, ann.token, b"x", bad)
            assert (caught.value.status, caught.value.code) == (400, "validation_failed")
            answer, _ = await raw_upload(node.services.port, ann.token, 1, [(0, b"x")], bad)
            status, _, body = parse(answer)
            assert status == 400
            assert body["details"]["path"] == "name"
        for good in ("résumé.pdf", "تقرير.pdf", "報告書.txt", "👩‍💻 notes.md", "a b.txt"):
            assert (await upload(base, ann.token, b"x", good))["name"] == good


# ------------------------------------------------------- a real node process


@dataclass
class Flood:
    """What the slow uploads of one member saw."""

    answers: list[tuple[int, float, str]] = field(default_factory=list)  # status, seconds, text
    # Set once all but per_member have their answer: the others are in
    # progress (or about to be).
    settled: trio.Event = field(default_factory=trio.Event)
    over: trio.Event = field(default_factory=trio.Event)


async def hold_slow_upload(port: int, token: str, n: int, flood: Flood, settled: int) -> None:
    """One byte a second of a 1,000-byte body, as long as the node listens;
    the socket stays open (as an attacker would keep it) until the flood is over."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    head = upload_head(token, 1000, f"slow-{n}")
    started = trio.current_time()
    answer = b""
    async with stream:
        async with trio.open_nursery() as nursery:

            async def trickle() -> None:
                try:
                    await stream.send_all(head)
                    while True:
                        await stream.send_all(b"x")
                        await trio.sleep(1.0)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

            nursery.start_soon(trickle)
            with trio.move_on_after(TIMEOUT):
                while not _complete(answer):
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    answer += data
            nursery.cancel_scope.cancel()
        status, _, body = parse(answer) if answer else (0, {}, {})
        flood.answers.append((status, trio.current_time() - started, body.get("message", "")))
        if len(flood.answers) >= settled:
            flood.settled.set()
        await flood.over.wait()


async def test_500_slow_uploads_of_one_member_hold_a_bounded_number_of_files(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_member, grace, uploads = 4, 3.0, 500
    monkeypatch.setenv(UPLOADS_PER_MEMBER_ENV, str(per_member))
    monkeypatch.setenv(UPLOAD_GRACE_ENV, str(grace))
    monkeypatch.setenv(UPLOAD_MIN_RATE_ENV, "1000")
    async with serve_subprocess(tmp_path / "data", database_url, tmp_path / "node.log") as proc:
        world = await World.create(proc)  # type: ignore[arg-type]
        mallory, bob = await world.member("mallory"), await world.member("bob")
        pid, port = proc.proc.pid, proc.port
        base = f"http://127.0.0.1:{port}"
        async with world.client(bob) as b:
            await make_channel(b, "room")
            await b.send("#room", "before")
            baseline = open_files(pid)
            flood = Flood()
            samples: list[int] = []
            async with trio.open_nursery() as nursery:
                for n in range(uploads):
                    nursery.start_soon(
                        hold_slow_upload, port, mallory.token, n, flood, uploads - per_member
                    )
                with trio.fail_after(TIMEOUT):
                    await flood.settled.wait()
                # A refused upload's connection is closed a second after its
                # answer; Mallory keeps all 500 open (and the admitted ones
                # trickling) while the node's files are counted.
                await trio.sleep(1.5)
                async with trio.open_nursery() as probes:

                    async def sample() -> None:
                        for _ in range(20):
                            samples.append(open_files(pid))
                            await trio.sleep(0.1)

                    probes.start_soon(sample)
                    t0 = trio.current_time()
                    payload = os.urandom(512 * KiB)
                    stored = await upload(base, bob.token, payload, "report.pdf")
                    sent = await b.send(
                        "#room", "the report", attachmentIds=[stored["attachmentId"]]
                    )
                    assert sent["state"] == "sent"
                    copy = await download(base, bob.token, stored["attachmentId"])
                    assert sha(copy) == sha(payload)
                    bob_took = trio.current_time() - t0
                with trio.fail_after(TIMEOUT):
                    while len(flood.answers) < uploads:
                        await trio.sleep(0.1)
                flood.over.set()

        # Refused at once, or admitted (per_member at a time; on a busy host a
        # slot freed by a cut upload may admit one more late in the flood) and
        # cut: a byte a second never meets 1,000 bytes/s, so at the grace's end.
        statuses = [status for status, _, _ in flood.answers]
        assert set(statuses) == {408, 429}, statuses
        assert statuses.count(429) > uploads // 2, statuses.count(429)
        cut = sorted((took, message) for status, took, message in flood.answers if status == 408)
        assert len(cut) >= per_member
        assert all("below 1000 bytes/s" in message for _, message in cut), cut
        assert grace - 0.5 < cut[0][0] < grace + 5, cut
        assert all(took > grace - 0.5 for took, _ in cut), cut
        # Bob's upload, download and send went through while the flood was held.
        assert bob_took < 5, bob_took
        # The node's open files: its own (the database pool among them) plus,
        # for Mallory, at most per_member uploads of a connection and a
        # staging file each, and Bob's upload.
        pool = Settings().pool_size
        bound = baseline + pool + 2 * per_member + 2
        assert max(samples) <= bound, (baseline, max(samples), samples)
        await trio.sleep(2)
        assert open_files(pid) <= baseline + pool


async def test_a_staging_file_left_by_a_killed_node_is_removed_at_start(
    database_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    store = data / "attachments"
    async with serve_subprocess(data, database_url, tmp_path / "node.log") as proc:
        world = await World.create(proc)  # type: ignore[arg-type]
        ann = await world.member("ann")
        # Past the first write (256 KiB), then nothing: a staging file exists.
        stream = await trio.open_tcp_stream("127.0.0.1", proc.port)
        await stream.send_all(upload_head(ann.token, MiB, "cut.bin") + b"\0" * (300 * KiB))
        with trio.fail_after(TIMEOUT):
            while not list((store / "tmp").glob("upload-*")):
                await trio.sleep(0.05)
        [staging] = (store / "tmp").glob("upload-*")
        assert mode(staging) == 0o600
        os.kill(proc.proc.pid, signal.SIGKILL)
        await proc.proc.wait()
        await stream.aclose()
    assert staging.exists()
    # An older store, made before the folders were private.
    for folder in (store, store / "tmp", store / "sha256"):
        folder.chmod(0o755)
    async with serve_subprocess(data, database_url, tmp_path / "node2.log"):
        assert not staging.exists()
        for folder in (store, store / "tmp", store / "sha256"):
            assert mode(folder) == 0o700, folder
