"""The placement rules of the local-server component: leases, least-loaded and sticky, capacity.

These run the component's own classes (``Servers`` over ``RemoteServer`` entries, which need no
process) to pin the rules down exactly; the same rules with real worker processes are exercised
by tests/adapters/test_server_workers.py (sessions spread and sticky, a dead worker restarted)
and tests/adapters/test_openenv.py (a single-session source growing to enough workers).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openenv_gym.adapters.local_servers.group import Lease, RemoteServer, Servers


def servers(n: int, capacity: int | None = None) -> Servers:
    group = Servers()
    group.workers = [RemoteServer(f"http://127.0.0.1:{9000 + i}") for i in range(n)]
    group.capacity = capacity
    return group


def test_a_lease_is_a_context_manager_that_counts_and_releases_once():
    group = servers(1)
    server = group.workers[0]
    with Lease(server) as lease:
        assert (server.held, server.busy) == (1, 1)
        lease.busy = False  # an idle socket keeps its server session
        assert (server.held, server.busy) == (1, 0)
        lease.busy = True
        lease.confirm()
        assert server.confirmed == 1
    assert (server.held, server.busy, server.confirmed) == (0, 0, 0)
    lease.release()  # again: nothing more to give back
    lease.busy = True  # a released lease counts nothing
    assert (server.held, server.busy) == (0, 0)


def test_the_least_busy_server_wins_and_ties_go_round_robin():
    group = servers(3)
    picked = [group.choose() for _ in range(3)]
    assert picked == group.workers, "equal counts: round-robin"
    leases = [Lease(s) for s in picked]
    leases[1].release()
    assert group.choose() is group.workers[1], "the one with no episode in flight"


def test_a_full_server_is_passed_over_and_none_means_start_another():
    group = servers(2, capacity=1)
    first = Lease(group.choose())
    second = Lease(group.choose())
    assert first.server is not second.server
    assert group.choose() is None, "every server holds its one session"
    second.busy = False  # idle, but still holding its session
    assert group.choose() is None
    assert group.choose(idle_on=[second.server]) is second.server, "its idle session can be reused"
    second.release()
    assert group.choose() is second.server


def test_an_idle_session_wins_a_tie():
    group = servers(2)
    idle = Lease(group.workers[1])
    idle.busy = False
    assert group.choose(idle_on=[group.workers[1]]) is group.workers[1]


def test_capacity_is_learned_from_the_refusal_or_from_the_sessions_it_accepted():
    group = servers(1)
    server = group.workers[0]
    refused = Lease(server)
    assert group.learn(refused, None) is None, "no session accepted yet: someone else holds the slots"
    assert group.learn(refused, 4) == 4, "the limit the refusal states"
    refused.release()
    group = servers(1)
    server = group.workers[0]
    accepted = [Lease(server) for _ in range(2)]
    for lease in accepted:
        lease.confirm()
    refused = Lease(server)
    assert group.learn(refused, None) == 2
    assert group.learn(refused, True) == 2, "a bool is not a limit"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["lease", "release", "idle", "busy"]), st.integers(0, 20)), max_size=60),
       st.integers(1, 3))
def test_counts_always_match_the_leases_held_and_no_server_is_overfilled(ops, capacity):
    group = servers(3, capacity=capacity)
    held: list[Lease] = []
    for op, i in ops:
        if op == "lease":
            server = group.choose()
            if server is None:
                assert all(s.held >= capacity for s in group.workers)
                continue
            held.append(Lease(server))
        elif held:
            lease = held[i % len(held)]
            if op == "release":
                lease.release()
                held.remove(lease)
            else:
                lease.busy = op == "busy"
        for server in group.workers:
            mine = [lease for lease in held if lease.server is server]
            assert server.held == len(mine) <= capacity
            assert server.busy == sum(lease.busy for lease in mine)


def test_a_remote_server_is_placed_even_when_full():
    from openenv_gym import runtime
    from openenv_gym.adapters.local_servers.group import RemoteServers

    group = RemoteServers("http://127.0.0.1:9", "OpenEnv server")
    group.capacity = 1
    Lease(group.workers[0])
    assert group.choose() is None
    # a URL cannot be given another process: the caller retries it, and says what to do after
    assert runtime.run_sync(group.place(), 10) is group.workers[0]
    assert not group.can_grow


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_limits_must_be_positive_integers(bad):
    from openenv_gym.adapters.ors.adapter import ORSAdapter
    from openenv_gym.errors import ConfigurationError

    for name in ("max_response_bytes", "max_json_depth"):
        with pytest.raises(ConfigurationError, match=f"{name} must be a positive integer"):
            ORSAdapter(url="http://127.0.0.1:9", **{name: bad})
