"""Provisioning of workspaces, members and tokens through the admin contract.

:class:`CliProvisioner` runs the ``scopenode admin …`` commands of
README as subprocesses (a few at a time). That costs an interpreter
start per call, so workloads provision few members and spread sessions over
them. :class:`PythonProvisioner` uses ``node.admin.provision(database_url,
spec)`` when the node ships it. :func:`make_provisioner` picks one.
"""

from __future__ import annotations

import importlib
import inspect
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio


@dataclass(frozen=True)
class Member:
    member_id: str
    handle: str
    type: str
    token: str


class ProvisioningError(Exception):
    """An admin command failed."""


class Provisioner(Protocol):
    async def create_workspace(self, name: str) -> str: ...

    async def create_members(
        self, workspace_id: str, member_type: str, handles: list[str]
    ) -> list[Member]: ...


def scopenode_cmd() -> list[str]:
    """The node's CLI: the script next to this interpreter, else on PATH, else the module."""
    beside = Path(sys.executable).parent / "scopenode"
    if beside.is_file():
        return [str(beside)]
    exe = shutil.which("scopenode")
    if exe is not None:
        return [exe]
    return [sys.executable, "-m", "node"]


class CliProvisioner:
    """``scopenode admin`` subprocesses against ``data_dir`` / ``database_url``."""

    def __init__(
        self, data_dir: str, database_url: str | None = None, *, parallel: int = 4
    ) -> None:
        self.data_dir = data_dir
        self.database_url = database_url
        self._limit = trio.CapacityLimiter(parallel)

    async def _admin(self, *args: str) -> dict[str, Any]:
        cmd = [*scopenode_cmd(), "admin", *args, "--data-dir", self.data_dir]
        if self.database_url:
            cmd += ["--database-url", self.database_url]
        async with self._limit:
            with trio.fail_after(120):
                proc = await trio.run_process(
                    cmd, capture_stdout=True, capture_stderr=True, check=False
                )
        if proc.returncode != 0:
            raise ProvisioningError(
                f"{' '.join(args[:1])} exited {proc.returncode}: {proc.stderr.decode()[-500:]}"
            )
        out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        if not isinstance(out, dict):
            raise ProvisioningError(f"unexpected output {out!r}")
        return out

    async def create_workspace(self, name: str) -> str:
        return str((await self._admin("create-workspace", "--name", name))["workspaceId"])

    async def create_members(
        self, workspace_id: str, member_type: str, handles: list[str]
    ) -> list[Member]:
        out: list[Member | None] = [None] * len(handles)

        async def one(i: int, handle: str) -> None:
            member = await self._admin(
                "create-member", "--workspace", workspace_id, "--type", member_type,
                "--handle", handle,
            )  # fmt: skip
            mid = str(member["memberId"])
            token = await self._admin("issue-token", "--member", mid)
            out[i] = Member(mid, handle, member_type, str(token["token"]))

        async with trio.open_nursery() as nursery:
            for i, h in enumerate(handles):
                nursery.start_soon(one, i, h)
        return [m for m in out if m is not None]


class PythonProvisioner:
    """``node.admin.provision(database_url, spec)``, one call per batch.

    Expected contract (to be confirmed with the node engineers): ``spec`` is
    ``{"workspace": {"id"?: …, "name"?: …}, "members": [{"type", "handle"}]}``
    and the result ``{"workspaceId", "members": [{"memberId", "handle", "token"}]}``.
    """

    def __init__(self, provision: Any, database_url: str) -> None:
        self._provision = provision
        self.database_url = database_url

    async def _call(self, spec: dict[str, Any]) -> dict[str, Any]:
        result = self._provision(self.database_url, spec)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, dict):
            raise ProvisioningError(f"node.admin.provision returned {result!r}")
        return result

    async def create_workspace(self, name: str) -> str:
        out = await self._call({"workspace": {"name": name}, "members": []})
        return str(out["workspaceId"])

    async def create_members(
        self, workspace_id: str, member_type: str, handles: list[str]
    ) -> list[Member]:
        spec = {
            "workspace": {"id": workspace_id},
            "members": [{"type": member_type, "handle": h} for h in handles],
        }
        out = await self._call(spec)
        return [
            Member(str(m["memberId"]), str(m["handle"]), member_type, str(m["token"]))
            for m in out["members"]
        ]


def make_provisioner(data_dir: str, database_url: str | None) -> Provisioner:
    """The fastest available provisioner for this node."""
    if database_url:
        try:
            admin = importlib.import_module("node.admin")
        except ImportError:
            admin = None
        provision = getattr(admin, "provision", None)
        if provision is not None:
            return PythonProvisioner(provision, database_url)
    return CliProvisioner(data_dir, database_url)
