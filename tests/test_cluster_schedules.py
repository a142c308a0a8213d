"""A schedule on a two-node cluster, one node killed with SIGKILL (docs/schedules.md).

Both nodes run the scheduler over one PostgreSQL. A schedule fires every
second for 30 s; midway one node is killed with SIGKILL, whatever claim it
held in flight. Counted by source ref afterwards: every occurrence from the
first to the last is stored, each exactly once.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import trio

from node.client import open_client
from storage.pg import connect
from tests.proc_cluster import make_team, proc_cluster

pytestmark = pytest.mark.slow

RUN_S = 30.0
KILL_AFTER_S = 12.0


@pytest.mark.runs_for(33)
async def test_every_occurrence_once_across_a_sigkill(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with proc_cluster(database_url, tmp_path, 2, proxy=False) as cluster:
            team = await make_team(database_url, "ticks", 1)
            survivor, victim = cluster.nodes
            url = f"{survivor.url}?workspace={team.workspace_id}"
            async with open_client(url, team.tokens[0]) as client:
                made = await client.create_schedule(
                    "#general", "tick", rule={"every": "interval", "seconds": 1}
                )
                await trio.sleep(KILL_AFTER_S)
                cluster.kill(victim)
                await trio.sleep(RUN_S - KILL_AFTER_S)
                # Pausing takes the row lock: once it answers, no claim is in flight.
                final = await client.pause_schedule(made["scheduleId"])
    occurrences = await _stored(database_url, made["scheduleId"])
    counts = Counter(occurrences)
    assert max(counts.values()) == 1, [o for o, n in counts.items() if n > 1]
    first = datetime.fromisoformat(made["nextAt"])
    grid = [first + timedelta(seconds=k) for k in range(len(counts))]
    assert sorted(counts) == grid  # none missed from the first to the last
    assert len(counts) >= RUN_S - 5
    assert final["fired"] == len(counts)


async def _stored(database_url: str, schedule_id: str) -> list[datetime]:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT metadata->'source'->>'occurrenceAt' FROM scope_messages"
            " WHERE metadata->'source'->>'scheduleId' = %s",
            (schedule_id,),
        )
        return [datetime.fromisoformat(str(row[0])) for row in await cur.fetchall()]
