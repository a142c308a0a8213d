"""Provisioning of workspaces, members and tokens through the admin contract.

:class:`CliProvisioner` runs the README's ``scopenode admin …`` commands
through ``scopenode admin batch``: one subprocess per step, whatever the
number of members (an interpreter's start costs more than the command).
"""

from __future__ import annotations

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
    """``scopenode admin batch`` subprocesses against ``data_dir`` / ``database_url``:
    one per step (the workspace; the members; their tokens), whatever the count."""

    def __init__(self, data_dir: str, database_url: str | None = None) -> None:
        self.data_dir = data_dir
        self.database_url = database_url

    async def _batch(self, lines: list[list[str]]) -> list[dict[str, Any]]:
        cmd = [*scopenode_cmd(), "admin", "batch", "--data-dir", self.data_dir]
        if self.database_url:
            cmd += ["--database-url", self.database_url]
        stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
        with trio.fail_after(120):
            proc = await trio.run_process(
                cmd, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
            )
        results = [json.loads(text) for text in proc.stdout.decode().splitlines() if text]
        failed = [r["error"] for r in results if isinstance(r, dict) and "error" in r]
        if proc.returncode != 0 or failed or len(results) != len(lines):
            why = failed[0] if failed else proc.stderr.decode()[-500:]
            raise ProvisioningError(f"{lines[0][0]} exited {proc.returncode}: {why}")
        return results

    async def create_workspace(self, name: str) -> str:
        (out,) = await self._batch([["create-workspace", "--name", name]])
        return str(out["workspaceId"])

    async def create_members(
        self, workspace_id: str, member_type: str, handles: list[str]
    ) -> list[Member]:
        if not handles:
            return []
        created = await self._batch(
            [
                ["create-member", "--workspace", workspace_id, "--type", member_type, "--handle", h]
                for h in handles
            ]
        )
        ids = [str(c["memberId"]) for c in created]
        tokens = await self._batch([["issue-token", "--member", mid] for mid in ids])
        return [
            Member(mid, handle, member_type, str(t["token"]))
            for mid, handle, t in zip(ids, handles, tokens, strict=True)
        ]


def make_provisioner(data_dir: str, database_url: str | None) -> Provisioner:
    """The provisioner for the node on ``data_dir`` / ``database_url``."""
    return CliProvisioner(data_dir, database_url)
