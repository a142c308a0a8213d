"""Split routing: two nodes host actors of the same scope at once (docs/cluster.md).

A routing proxy never guarantees one node per scope (a reload moves a route,
a client connects directly), so correctness rests on the database fence.
Clients of one workspace connect straight to two node subprocesses and send
concurrently into one channel, each with the freshness frontier of what it
has received. The stored seqs are gap-free and each send is stored once, every
session receives every seq once in order, and every freshness answer is
right against the final history: ``sent`` only when no message
was stored between the frontier and the new one, ``held`` only when one was.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from node.client import Client, open_client
from tests.proc_cluster import gaps_and_duplicates, make_team, proc_cluster, scope_history

PEOPLE = 4
SENDS = 25  # per client
ATTEMPTS = 50  # per send: a held send is retried after reading up to needsRefreshUntilSeq
RUN_LIMIT = 60.0
WAIT = 10.0


@dataclass
class Sender:
    name: str
    client: Client
    scope_id: str
    received: list[int] = field(default_factory=list)
    # (state, seenUpToSeq, acceptedSeq or needsRefreshUntilSeq, clientMessageId)
    answers: list[tuple[str, int, int, str]] = field(default_factory=list)

    @property
    def seen(self) -> int:
        return self.received[-1] if self.received else 0

    async def receive(self) -> None:
        while True:
            event = await self.client.next_event()
            if event["type"] == "message" and event["scopeId"] == self.scope_id:
                self.received.append(int(event["message"]["seq"]))

    async def send(self, cmid: str) -> dict[str, Any]:
        for _ in range(ATTEMPTS):
            seen = self.seen
            fresh = {"targetKey": self.scope_id, "seenUpToSeq": seen}
            reply = await self.client.send("#general", cmid, clientMessageId=cmid, freshness=fresh)
            if reply["state"] in ("sent", "already_sent"):
                self.answers.append((reply["state"], seen, int(reply["acceptedSeq"]), cmid))
                return reply
            assert reply["state"] == "held", reply
            until = int(reply["needsRefreshUntilSeq"])
            self.answers.append(("held", seen, until, cmid))
            await self.received_up_to(until)
        raise AssertionError(f"{cmid} held {ATTEMPTS} times")

    async def received_up_to(self, seq: int) -> None:
        with trio.fail_after(WAIT):
            while self.seen < seq:
                await trio.sleep(0.005)

    async def load(self) -> None:
        for i in range(SENDS):
            await self.send(f"{self.name}-{i}")


def check_freshness(sender: Sender, final: int) -> None:
    """The gate is a compare-and-set on the scope's latest seq, whichever node's
    actor answers: ``sent`` lands right after the frontier, ``held`` names a
    later latest seq."""
    for state, seen, seq, cmid in sender.answers:
        if state == "sent":
            assert seq == seen + 1, (cmid, seen, seq)
        elif state == "held":
            assert seen < seq <= final, (cmid, seen, seq)


async def test_two_nodes_hosting_one_scope_never_duplicate_or_skip_a_seq_and_freshness_holds(
    database_url: str, tmp_path: Path
) -> None:
    async with proc_cluster(database_url, tmp_path, 2, proxy=False) as cluster:
        team = await make_team(database_url, "split", PEOPLE)
        urls = [f"{node.url}?workspace={team.workspace_id}" for node in cluster.nodes]
        async with (
            open_client(urls[0], team.tokens[0]) as c0,
            open_client(urls[0], team.tokens[1]) as c1,
            open_client(urls[1], team.tokens[2]) as c2,
            open_client(urls[1], team.tokens[3]) as c3,
        ):
            senders = [
                Sender(f"p{i}", client, team.general) for i, client in enumerate((c0, c1, c2, c3))
            ]
            assert [c.welcome["nodeId"] for c in (c0, c1, c2, c3)] == [
                "node0",
                "node0",
                "node1",
                "node1",
            ]
            with trio.fail_after(RUN_LIMIT):
                async with trio.open_nursery() as receivers:
                    for sender in senders:
                        receivers.start_soon(sender.receive)
                    async with trio.open_nursery() as load:
                        for sender in senders:
                            load.start_soon(sender.load)

                    # Deterministic too: node1 writes, then a node0 session that
                    # has not seen it yet is held, and sends once it has.
                    p0, p2 = senders[0], senders[2]
                    latest = max(max(s.received, default=0) for s in senders)
                    await p0.received_up_to(latest)
                    stale = p0.seen
                    written = await p2.send("p2-last")
                    fresh = {"targetKey": team.general, "seenUpToSeq": stale}
                    held = await c0.send(
                        "#general", "p0-last", clientMessageId="p0-last", freshness=fresh
                    )
                    assert held["state"] == "held", held
                    # Held up to what node0 knows: p2's write, or an earlier seq
                    # p0 had not seen when node0 has not heard of p2's yet.
                    assert stale < held["needsRefreshUntilSeq"] <= written["acceptedSeq"]
                    last = await p0.send("p0-last")
                    assert last["acceptedSeq"] == written["acceptedSeq"] + 1

                    for sender in senders:
                        await sender.received_up_to(last["acceptedSeq"])
                    receivers.cancel_scope.cancel()

        history = await scope_history(database_url, team.general)
        final = max(history)
        assert final == PEOPLE * SENDS + 2
        assert sorted(history) == list(range(1, final + 1))
        assert [c for c, n in Counter(history.values()).items() if n > 1] == []
        for sender in senders:
            for state, _seen, seq, cmid in sender.answers:
                if state != "held":
                    assert history[seq] == cmid, (sender.name, cmid, seq)
            missing, duplicates = gaps_and_duplicates(sender.received)
            assert (sender.name, missing, duplicates) == (sender.name, [], [])
            assert sender.received == list(range(1, final + 1)), sender.name
            check_freshness(sender, final)
        # The two actors really raced: some sends were held by the other node's writes.
        assert sum(state == "held" for s in senders for state, *_ in s.answers) >= 1
