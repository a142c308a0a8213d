"""The moderation boundary (docs/design.md#moderation).

A human's send that matches the deployment keyword list is answered
``moderation_blocked`` with ``details.matched`` and leaves exactly one trace,
its ``moderation_audit_log`` row: no message, no outbox row, no search
document, nothing pushed. The same text from an agent is sent. The list is
re-read on SIGHUP (a real ``scopenode serve`` process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.model import MemberType
from actors.moderation import KeywordList, parse_keyword_file
from bench.nodeproc import free_port, stop_process, wait_healthy
from node.client import ClientError
from storage.pg import connect
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10

# ---------------------------------------------------------------- the matcher


def test_matcher_is_case_insensitive_word_aware_and_normalised() -> None:
    words = KeywordList.of(["darn", "Bad Word", "ﬁre", "c++"])
    assert words.matches("DARN it") == ("darn",)
    assert words.matches("darned, undarn, darn_it") == ()  # word boundaries
    assert words.matches("a bad\n  word here") == ("Bad Word",)  # any whitespace in a phrase
    assert words.matches("ＤＡＲＮ") == ("darn",)  # full-width folds under NFKC
    assert words.matches("FIRE!") == ("ﬁre",)  # the ligature keyword is normalised too
    assert words.matches("I like c++.") == ("c++",)
    assert words.matches("darn, a BAD WORD") == ("darn", "Bad Word")
    assert KeywordList().matches("anything") == ()


def test_keyword_file_skips_blanks_and_comments() -> None:
    text = "# deployment list\n\n  darn  \nbad word\n#not this\n"
    assert parse_keyword_file(text) == ("darn", "bad word")


# ---------------------------------------------------------------- the node


async def counts(database_url: str, workspace_id: str) -> dict[str, int]:
    queries = {
        "messages": "SELECT count(*) FROM scope_messages WHERE workspace_id = %s",
        "outbox": "SELECT count(*) FROM scope_fanout_outbox WHERE workspace_id = %s",
        "search": "SELECT count(*) FROM scope_message_search_docs WHERE workspace_id = %s",
        "audit": "SELECT count(*) FROM moderation_audit_log WHERE workspace_id = %s",
    }
    out = {}
    async with await connect(database_url, autocommit=True) as conn:
        for name, sql in queries.items():
            cur = await conn.execute(sql, (workspace_id,))
            row = await cur.fetchone()
            assert row is not None
            out[name] = int(row[0])
    return out


async def test_blocked_human_send_leaves_only_the_audit_row(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(
        database_url, tmp_path, moderation_keywords=("forbidden phrase", "darn")
    ) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        bot = await world.member("bot", MemberType.AGENT)
        async with (
            world.client(ann) as a,
            world.client(bob) as b,
            world.client(bot) as c,
        ):
            scope_id = await make_channel(a, "mod", b, c)
            await a.send("#mod", "hello", clientMessageId="ok-1")
            await b.events_until(lambda e: e["type"] == "message", timeout=TIMEOUT)
            before = await counts(database_url, world.workspace_id)

            text = "well, DARN it: a Forbidden   phrase"
            with pytest.raises(ClientError) as caught:
                await a.send("#mod", text, clientMessageId="blocked-1")
            assert caught.value.code == "moderation_blocked"
            assert caught.value.details["matched"] == ["forbidden phrase", "darn"]
            after = await counts(database_url, world.workspace_id)
            assert after == before | {"audit": before["audit"] + 1}

            # Nothing was pushed: the next event bob sees is the agent's send.
            sent = await c.send("#mod", text, clientMessageId="agent-1")
            assert sent["state"] == "sent"
            event = await b.next_event(timeout=TIMEOUT)
            assert event["type"] == "message"
            assert event["message"]["id"] == sent["messageId"]
            assert event["message"]["content"] == text
            page = await b.history("#mod")
            assert [m["content"] for m in page["messages"]] == ["hello", text]

            # A retry of the blocked send is blocked again (and audited again):
            # the clientMessageId was never used.
            with pytest.raises(ClientError):
                await a.send("#mod", text, clientMessageId="blocked-1")
            async with await connect(database_url, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT scope_id, target, human_member_id, author_member_id, content,"
                    " matched_keywords, created_at FROM moderation_audit_log"
                    " WHERE workspace_id = %s ORDER BY id",
                    (world.workspace_id,),
                )
                rows = await cur.fetchall()
            assert len(rows) == 2
            scope, target, human, author, content, matched, created_at = rows[0]
            assert (scope, target, human, author, content) == (
                scope_id,
                "#mod",
                ann.id,
                ann.id,
                text,
            )
            assert matched == ["forbidden phrase", "darn"]
            assert created_at is not None


async def test_a_blocked_dm_creates_no_dm(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path, moderation_keywords=("darn",)) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with world.client(ann) as a:
            with pytest.raises(ClientError) as caught:
                await a.send(f"dm:{bob.id}", "darn", clientMessageId="dm-1")
            assert caught.value.code == "moderation_blocked"
        async with await connect(database_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM scopes WHERE workspace_id = %s AND type = 'dm'",
                (world.workspace_id,),
            )
            assert await cur.fetchone() == (0,)
            cur = await conn.execute(
                "SELECT scope_id, target FROM moderation_audit_log WHERE workspace_id = %s",
                (world.workspace_id,),
            )
            assert await cur.fetchall() == [(None, f"dm:{bob.id}")]


async def _send(client: Any, content: str, cmid: str) -> str:
    try:
        reply = await client.send("#hup", content, clientMessageId=cmid)
    except ClientError as exc:
        return exc.code
    return str(reply["state"])


async def test_sighup_reloads_the_keyword_list(database_url: str, tmp_path: Path) -> None:
    words = tmp_path / "words.txt"
    words.write_text("darn\n", encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "node", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--data-dir", str(tmp_path / "data"), "--database-url", database_url]
    cmd += ["--log-level", "warning", "--moderation-file", str(words)]
    log_path = tmp_path / "node.log"
    with log_path.open("ab") as log:
        proc = await trio.lowlevel.open_process(cmd, stdout=log, stderr=log)
        try:
            try:
                await wait_healthy(f"ws://127.0.0.1:{port}", proc, 60.0)
            except (RuntimeError, trio.TooSlowError) as exc:
                raise AssertionError(f"node did not start: {log_path.read_text()[-3000:]}") from exc

            class Node:
                url = f"ws://127.0.0.1:{port}/v1/ws"

            node: Any = Node()
            node.database_url = database_url
            world = World(node, "")
            world.workspace_id = (await World.create(node)).workspace_id
            ann = await world.member("ann")
            async with world.client(ann) as a:
                await make_channel(a, "hup")
                assert await _send(a, "darn", "1") == "moderation_blocked"
                assert await _send(a, "heck", "2") == "sent"

                words.write_text("heck\n", encoding="utf-8")
                os.kill(proc.pid, signal.SIGHUP)
                with trio.fail_after(TIMEOUT):
                    while await _send(a, "heck", "3") != "moderation_blocked":
                        await trio.sleep(0.05)
                assert await _send(a, "darn", "4") == "sent"

                # An unreadable file keeps the list in force; the node lives on.
                words.unlink()
                os.kill(proc.pid, signal.SIGHUP)
                await trio.sleep(0.3)
                assert proc.poll() is None
                assert await _send(a, "heck", "5") == "moderation_blocked"
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(proc)


def test_serve_refuses_an_unreadable_moderation_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "node", "serve", "--port", "0", "--data-dir", str(tmp_path)),
            *("--moderation-file", str(missing)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("scopenode: --moderation-file:"), done.stderr


async def test_an_edit_to_a_blocked_word_is_refused_and_the_old_content_stays(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, moderation_keywords=("darn",)) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b:
            scope_id = await make_channel(a, "mod", b)
            sent = await a.send("#mod", "all fine")
            await b.events_until(lambda e: e["type"] == "message", timeout=TIMEOUT)
            with pytest.raises(ClientError) as caught:
                await a.edit(sent["messageId"], "darn it")
            assert caught.value.code == "moderation_blocked"
            assert caught.value.details["matched"] == ["darn"]
            page = await b.history("#mod")
            [message] = page["messages"]
            assert (message["content"], message["revision"]) == ("all fine", 0)
            async with await connect(database_url, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT scope_id, target, content FROM moderation_audit_log"
                    " WHERE workspace_id = %s",
                    (world.workspace_id,),
                )
                assert await cur.fetchall() == [(scope_id, f"scope:{scope_id}", "darn it")]
            # Nothing was pushed for the refused edit: bob's next event is the next send.
            later = await a.send("#mod", "later")
            event = await b.next_event(timeout=TIMEOUT)
            assert event["type"] == "message"
            assert event["message"]["id"] == later["messageId"]
