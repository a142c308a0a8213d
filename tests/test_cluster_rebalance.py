"""Rebalance under load: a node joins and HAProxy reloads with ``-sf`` (docs/cluster.md).

Three real nodes behind the real HAProxy carry a steady, bounded load of
sends from clients of several workspaces. A fourth node starts, HAProxy is
reloaded with it: the established tunnels stay on the old HAProxy process
and their nodes. Then every client's connection drops (as on a network blip)
and it reconnects through the new HAProxy: the workspaces whose hash moved
land on the new node and resume there. No acknowledged send is lost, no seq
is stored twice or skipped, every client sees every seq once in order, and
the old HAProxy process exits once its last tunnel is gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.cluster_cli import HAPROXY_MISSING, find_haproxy
from tests.conftest import require_tool
from tests.proc_cluster import (
    Team,
    all_sent,
    check_scope,
    make_team,
    proc_cluster,
    scope_history,
    stay_until_latest,
    team_clients,
    warmed_up,
)

pytestmark = [
    require_tool("haproxy", None if find_haproxy() else HAPROXY_MISSING),
    # See tests/test_cluster_failover.py: a rejected upgrade leaks a client socket.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

BATCHES = 6  # of 8 workspaces, probed for their route with four nodes
MOVING = 2  # of which this many move to the new node...
STAYING = 3  # ...and this many stay where they are
PEOPLE = 2
SENDS = 30
INTERVAL = 0.1
RUN_LIMIT = 60.0
WARM_ACKS = 6
TEST_LIMIT = 120.0


@pytest.mark.runs_for(11)
async def test_adding_a_node_and_reloading_haproxy_mid_load_loses_nothing(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_LIMIT):
        await rebalance(database_url, tmp_path)


async def rebalance(database_url: str, tmp_path: Path) -> None:
    async with proc_cluster(database_url, tmp_path, 4, proxy=False) as cluster:
        old_nodes, new_node = cluster.nodes[:3], cluster.nodes[3]
        moving: list[Team] = []
        staying: list[Team] = []
        for batch in range(BATCHES):
            candidates = [await make_team(database_url, f"t{batch}-{i}", PEOPLE) for i in range(8)]
            routes = await cluster.routes(cluster.nodes, candidates)
            for team in candidates:
                moves = routes[team.workspace_id] == new_node.name
                (moving if moves else staying).append(team)
            if len(moving) >= MOVING and len(staying) >= STAYING:
                break
        moving, staying = moving[:MOVING], staying[:STAYING]
        assert len(moving) == MOVING  # about a quarter of the workspaces move
        teams: list[Team] = moving + staying
        await cluster.start_proxy(old_nodes)
        clients = team_clients(cluster.url, teams)
        deadline = trio.current_time() + RUN_LIMIT
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(client.run, SENDS, INTERVAL, deadline)
            await warmed_up(clients, WARM_ACKS)
            before = {c.name: c.node for c in clients}
            assert new_node.name not in before.values()

            await cluster.start_proxy(cluster.nodes)  # the reload, -sf
            old_proxy = cluster.proxies[0]
            await trio.sleep(1.0)
            # Established tunnels survived the reload, on their nodes. A disturbed
            # client's nodes and errors tell a proxy's cut (a reset, then another
            # node) from a handshake that timed out.
            assert old_proxy.returncode is None
            moved = {c.name: (c.nodes, c.errors) for c in clients if len(c.nodes) > 1 or c.errors}
            assert moved == {}

            for client in clients:
                client.bounce()
            bounced_at = trio.current_time()
            await all_sent(clients, SENDS, deadline)
            await stay_until_latest(database_url, teams, clients)

        for team in teams:
            history = await scope_history(database_url, team.general)
            check_scope([c for c in clients if c.scope_id == team.general], history)
        for client in clients:
            assert client.sends_done == SENDS, (client.name, client.sends_done)
            assert [t for t in client.resumed_at if t > bounced_at], client.name
            team = next(t for t in teams if t.general == client.scope_id)
            expected = new_node.name if team in moving else before[client.name]
            assert (client.name, client.node) == (client.name, expected), client.nodes
        # The old HAProxy let go once its last tunnel closed.
        with trio.fail_after(5):
            await old_proxy.wait()
