"""Where attachment bytes live: a driver interface and the filesystem driver.

Bytes are content-addressed: the key of a blob is the lowercase hex SHA-256
of its bytes, so two uploads of the same file share one blob and a blob is
never rewritten with other content. Rows of ``attachments`` name their blob
by ``(storage_driver, storage_object_key)``; ``storage/attachments.py``
decides when a blob may go (no row names it any more).

An upload is written while it arrives, before its hash is known: the driver
hands out a :class:`StagedBlob` to append to, and :meth:`BlobStore.put` files
it under its hash. The filesystem driver stages into ``<root>/tmp`` and moves
the file into place with one rename; an S3-compatible driver would stage a
multipart upload under a temporary key and copy it to the hash key (or keep
the hash as the key of a completed multipart upload), with no change to the
callers. Reads are an async iterator of chunks, so neither side ever holds a
whole file.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO, Protocol

import trio

CHUNK_BYTES = 256 * 1024
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class StagedBlob(Protocol):
    """An upload being written, not yet addressable."""

    async def write(self, data: bytes) -> None: ...

    async def discard(self) -> None:
        """Drop what was written (idempotent; a no-op once put)."""
        ...


class BlobStore(Protocol):
    """Content-addressed bytes, by SHA-256 hex digest."""

    #: The ``attachments.storage_driver`` value of this driver's rows.
    driver: str

    async def stage(self) -> StagedBlob: ...

    async def put(self, staged: StagedBlob, digest: str) -> None:
        """File ``staged`` under ``digest`` (the caller hashed what it wrote).
        Replaces a blob with the same digest, which has the same bytes."""
        ...

    def open(self, digest: str) -> AsyncIterator[bytes]:
        """The blob's bytes in chunks; FileNotFoundError if there is none."""
        ...

    async def exists(self, digest: str) -> bool: ...

    async def delete(self, digest: str) -> None:
        """Remove the blob; a missing one is not an error."""
        ...


def check_digest(digest: str) -> str:
    # Digests become paths (and object keys): only the canonical form passes.
    if not _DIGEST.match(digest):
        raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
    return digest


class _StagedFile:
    def __init__(self, path: Path, file: BinaryIO) -> None:
        self.path = path
        self.file: BinaryIO | None = file

    async def write(self, data: bytes) -> None:
        assert self.file is not None, "write after put or discard"
        # Off the event loop: a write may wait for the disk.
        await trio.to_thread.run_sync(self.file.write, data)

    async def discard(self) -> None:
        file, self.file = self.file, None
        if file is None:
            return
        await trio.to_thread.run_sync(_close_and_unlink, file, self.path)


def _close_and_unlink(file: BinaryIO, path: Path) -> None:
    file.close()
    path.unlink(missing_ok=True)


class FilesystemBlobStore:
    """Blobs as files under ``root`` (``<root>/sha256/ab/cd/<digest>``).

    Several nodes may share ``root`` (one directory for a cluster): staging
    files have random names, a put is an atomic rename within the directory
    tree, and the same digest always has the same bytes, so concurrent puts
    of one file are harmless.
    """

    driver = "local"

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / "sha256" / digest[:2] / digest[2:4] / digest

    async def stage(self) -> StagedBlob:
        tmp = self.root / "tmp"
        path = tmp / f"upload-{secrets.token_hex(12)}"

        def create() -> BinaryIO:
            tmp.mkdir(parents=True, exist_ok=True)
            return open(path, "xb")  # closed by put or discard

        return _StagedFile(path, await trio.to_thread.run_sync(create))

    async def put(self, staged: StagedBlob, digest: str) -> None:
        assert isinstance(staged, _StagedFile)
        target = self.path_of(digest)
        file, staged.file = staged.file, None
        assert file is not None, "put after put or discard"

        def finish() -> None:
            try:
                file.flush()
                os.fsync(file.fileno())
                file.close()
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged.path, target)
            except BaseException:
                _close_and_unlink(file, staged.path)
                raise

        await trio.to_thread.run_sync(finish)

    async def open(self, digest: str) -> AsyncIterator[bytes]:
        path = self.path_of(digest)
        file = await trio.to_thread.run_sync(open, path, "rb")
        try:
            while True:
                chunk = await trio.to_thread.run_sync(file.read, CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
        finally:
            file.close()

    async def exists(self, digest: str) -> bool:
        return await trio.to_thread.run_sync(self.path_of(digest).is_file)

    async def delete(self, digest: str) -> None:
        await trio.to_thread.run_sync(lambda: self.path_of(digest).unlink(missing_ok=True))

    async def sweep_staging(self, older_than: float) -> int:
        """Remove staging files older than ``older_than`` seconds (uploads cut
        off by a node that died); returns how many went."""

        def sweep() -> int:
            cutoff = time.time() - older_than
            removed = 0
            for path in (self.root / "tmp").glob("upload-*"):
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
            return removed

        return await trio.to_thread.run_sync(sweep)
