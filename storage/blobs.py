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

The filesystem driver keeps its files to the node's user: folders 0700 and
files 0600, whatever the umask. A staging file is locked (``flock``) by the
upload writing it for as long as it sits in ``<root>/tmp``, so a staging file
nobody holds belongs to an upload that is over, cut off by a node that died,
and :meth:`FilesystemBlobStore.sweep_staging` removes it at once, also while
other nodes sharing the directory are uploading. The store also remembers
its own live staging files: where ``flock`` is emulated with POSIX locks
(NFS), a process's own locks do not keep it out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO, Protocol

import trio

CHUNK_BYTES = 256 * 1024
FOLDER_MODE = 0o700
FILE_MODE = 0o600
STAGING_PREFIX = "upload-"
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

    async def prepare(self) -> None:
        """Make the store private to the node's user (at node start)."""
        ...

    async def sweep_staging(self, stale_after: float) -> int:
        """Drop what uploads that are over left staged; returns how many.
        Anything staged longer than ``stale_after`` seconds goes too."""
        ...


def check_digest(digest: str) -> str:
    # Digests become paths (and object keys): only the canonical form passes.
    if not _DIGEST.match(digest):
        raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
    return digest


class _StagedFile:
    def __init__(self, path: Path, file: BinaryIO, live: set[Path]) -> None:
        self.path = path
        self.file: BinaryIO | None = file
        self.live = live

    async def write(self, data: bytes) -> None:
        assert self.file is not None, "write after put or discard"
        # Off the event loop: a write may wait for the disk.
        await trio.to_thread.run_sync(self.file.write, data)

    async def discard(self) -> None:
        file, self.file = self.file, None
        if file is None:
            return
        try:
            await trio.to_thread.run_sync(_unlink_and_close, file, self.path)
        finally:
            self.live.discard(self.path)


def _unlink_and_close(file: BinaryIO, path: Path) -> None:
    # Unlinked before the close drops the lock: a sweeper never sees it unheld.
    try:
        path.unlink(missing_ok=True)
    finally:
        file.close()


def make_folders(path: Path) -> None:
    """``mkdir -p`` with every folder it creates 0700 (``Path.mkdir`` gives
    the parents it creates the default mode)."""
    missing: list[Path] = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, FOLDER_MODE)
            os.chmod(folder, FOLDER_MODE)  # the umask may have taken bits off


def _create_locked(path: Path) -> BinaryIO | None:
    """A new staging file at ``path``, locked; None if a sweeper removed it
    between the create and the lock (the caller tries another name)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    file = os.fdopen(fd, "wb")
    try:
        # Blocks only while a sweeper that opened the file first holds it.
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return file
    except FileNotFoundError:
        pass
    except BaseException:
        file.close()
        raise
    file.close()
    return None


def _remove_if_unheld(path: Path, stale_before: float) -> bool:
    """Remove the staging file at ``path`` unless an upload holds its lock
    (kept anyway past ``stale_before``, a wall-clock time); True if removed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)  # NFS locks need a writable file
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if os.fstat(fd).st_mtime >= stale_before:
                return False
        # The file at ``path`` may have been filed under its hash and replaced
        # since the open: only the inode that was locked goes.
        if os.stat(path).st_ino != os.fstat(fd).st_ino:
            return False
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def _make_private(root: Path) -> int:
    """Folders of the store 0700 (the files under them are then out of other
    users' reach); returns how many were changed."""
    changed = 0

    def private(path: Path, mode: int) -> None:
        nonlocal changed
        if stat.S_IMODE(mode) != FOLDER_MODE:
            os.chmod(path, FOLDER_MODE)
            changed += 1

    for folder in (root, root / "tmp", root / "sha256"):
        make_folders(folder)
        private(folder, folder.stat().st_mode)
    # Two levels of fan-out (sha256/ab/cd), at most 65,536 folders.
    with os.scandir(root / "sha256") as firsts:
        for first in firsts:
            if not first.is_dir(follow_symlinks=False):
                continue
            private(Path(first.path), first.stat(follow_symlinks=False).st_mode)
            with os.scandir(first.path) as seconds:
                for second in seconds:
                    if second.is_dir(follow_symlinks=False):
                        private(Path(second.path), second.stat(follow_symlinks=False).st_mode)
    return changed


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
        # Staging files of this store's uploads in progress. Added before the
        # file exists, removed once it has left tmp; the sweep's thread only
        # tests membership (atomic under the GIL).
        self._live: set[Path] = set()

    def path_of(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / "sha256" / digest[:2] / digest[2:4] / digest

    async def stage(self) -> StagedBlob:
        tmp = self.root / "tmp"

        def create() -> _StagedFile:
            make_folders(tmp)
            while True:
                path = tmp / f"{STAGING_PREFIX}{secrets.token_hex(12)}"
                self._live.add(path)
                try:
                    file = _create_locked(path)  # closed by put or discard
                except BaseException:
                    self._live.discard(path)
                    raise
                if file is not None:
                    return _StagedFile(path, file, self._live)
                self._live.discard(path)

        return await trio.to_thread.run_sync(create)

    async def put(self, staged: StagedBlob, digest: str) -> None:
        assert isinstance(staged, _StagedFile)
        target = self.path_of(digest)
        file, staged.file = staged.file, None
        assert file is not None, "put after put or discard"

        def finish() -> None:
            try:
                file.flush()
                os.fsync(file.fileno())
                make_folders(target.parent)
                # Moved while still locked, so no sweeper takes it on the way.
                os.replace(staged.path, target)
            except BaseException:
                _unlink_and_close(file, staged.path)
                raise
            file.close()

        try:
            await trio.to_thread.run_sync(finish)
        finally:
            self._live.discard(staged.path)

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

    async def prepare(self) -> None:
        await trio.to_thread.run_sync(_make_private, self.root)

    async def sweep_staging(self, stale_after: float) -> int:
        """Remove the staging files no upload holds (those of uploads cut off by
        a node that died), and any not written for ``stale_after`` seconds;
        returns how many went. Safe while this and other nodes upload."""

        def sweep() -> int:
            stale_before = time.time() - stale_after
            tmp = self.root / "tmp"
            if not tmp.is_dir():
                return 0
            return sum(
                _remove_if_unheld(path, stale_before)
                for path in tmp.glob(f"{STAGING_PREFIX}*")
                if path not in self._live
            )

        return await trio.to_thread.run_sync(sweep)
