"""The fleet view assembled from the pool's and batcher's state (pure)."""

from __future__ import annotations

from infaas.api.routes.fleet import fleet_view
from infaas.types import FleetEvent, WorkerInfo


def worker(wid: str, loaded: tuple[str, ...], used_mb: float) -> WorkerInfo:
    return WorkerInfo(
        worker_id=wid,
        family="onnxruntime",
        alive=True,
        loaded=loaded,
        memory_used_mb=used_mb,
        memory_budget_mb=512.0,
    )


def test_fleet_view_sums_sorts_and_puts_the_newest_decision_first() -> None:
    events = [
        FleetEvent(at_s=3.0, kind="evict", variant="a", worker_id="w1", reason="least recently used"),
        FleetEvent(at_s=1.0, kind="load", variant="a", worker_id="w1", reason="on demand"),
        FleetEvent(at_s=2.0, kind="route", variant="b", reason="digits routed to b"),
    ]
    view = fleet_view([worker("w2", ("b",), 10.0), worker("w1", ("a", "b"), 30.0)], {"b": 4, "a": 0}, events)
    assert [w.worker_id for w in view.workers] == ["w1", "w2"]
    assert view.memory_used_mb == 40.0 and view.memory_budget_mb == 1024.0
    assert view.loaded_variants == 3
    assert list(view.queue_depths) == ["a", "b"]
    assert [e.at_s for e in view.events] == [3.0, 2.0, 1.0]


def test_an_empty_fleet() -> None:
    view = fleet_view([], {}, [])
    assert view.workers == () and view.memory_budget_mb == 0.0 and view.events == ()
