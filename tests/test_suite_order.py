"""The suite's order on several workers (conftest.py, helpers.deal), against pytest-xdist's own
`worksteal` scheduler handing out the first shares."""
from __future__ import annotations

import pytest
from xdist.scheduler import WorkStealingScheduling

from helpers import deal


class _Config:
    """What the scheduler reads of pytest's config: the workers (`-n N` is `--tx N*popen`)."""

    def __init__(self, workers: int):
        self.workers = workers

    def getvalue(self, name: str):
        assert name == "tx"
        return [f"{self.workers}*popen"]


class _Worker:
    def __init__(self, name: str):
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)


def _shares(order: list[str], workers: int) -> list[list[str]]:
    """The tests each worker gets first from xdist's worksteal scheduler, in its running order."""
    scheduler = WorkStealingScheduling(_Config(workers))
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, order)
    scheduler.schedule()
    return [[order[i] for i in node.sent] for node in nodes]


@pytest.mark.parametrize("workers", [2, 3])
def test_the_longest_tests_start_first_on_workers_of_even_expected_time(workers):
    expected = {"pipeline": 250.0, "paper": 145.0, "compile": 70.0, "queue": 25.0, "ddp": 22.0, "static": 20.0}
    tests = [f"quick{i}" for i in range(7)] + ["paper", "quick7", "static", "pipeline", "queue"] \
        + [f"quick{i}" for i in range(8, 20)] + ["compile", "ddp"]
    order = deal(tests, expected, workers)
    assert sorted(order) == sorted(tests)
    shares = _shares(order, workers)
    assert sorted(sum(shares, [])) == sorted(tests)
    for share in shares:
        # The known ones at the front, longest first; the rest in the collection's order.
        known = [test for test in share if test in expected]
        assert share[:len(known)] == sorted(known, key=lambda test: -expected[test])
        rest = share[len(known):]
        assert rest == sorted(rest, key=tests.index)
    loads = sorted(sum(expected.get(test, 0.0) for test in share) for share in shares)
    if workers == 2:  # greedy longest-first: pipeline, static | paper, compile, queue, ddp
        assert loads == [262.0, 270.0]
    else:  # pipeline | paper | compile, queue, ddp, static
        assert loads == [137.0, 145.0, 250.0]


def test_one_worker_or_no_known_test_keeps_the_collections_order():
    tests = [f"t{i}" for i in range(9)]
    assert deal(tests, {}, 2) == tests
    assert deal(tests, {"t5": 10.0}, 1) == ["t5", *tests[:5], *tests[6:]]  # (one share: the known first)
