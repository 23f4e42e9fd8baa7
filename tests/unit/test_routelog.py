"""Routing changes for the fleet view, from meter records (pure, no server)."""

from __future__ import annotations

from infaas.metering import MeterRecord
from infaas.routelog import RouteLog


def answer(task: str, variant: str, at_s: float, tenant: str = "acme") -> MeterRecord:
    return MeterRecord(
        tenant=tenant, task=task, variant=variant, outcome="ok", latency_ms=1.5, cost_pusd=10, rows=1,
        batch_rows=4, slo_met=True, at_s=at_s,
    )  # fmt: skip


def failure(task: str, error: str, at_s: float) -> MeterRecord:
    return MeterRecord(
        tenant="acme", task=task, variant="", outcome=error, latency_ms=0.2, cost_pusd=0, rows=1,
        batch_rows=0, slo_met=False, at_s=at_s, error=error,
    )  # fmt: skip


def test_an_event_when_a_task_starts_on_a_variant_not_per_query() -> None:
    log = RouteLog(idle_s=60.0)
    for i in range(100):  # two tenants with different targets: two variants of one task, interleaved
        log.listener(
            answer("digits", "d/a" if i % 2 else "d/b", at_s=float(i), tenant="acme" if i % 2 else "beta")
        )
    log.listener(answer("iris", "i/a", at_s=100.0))
    log.listener(failure("digits", "no_feasible_variant", at_s=102.0))
    log.listener(failure("digits", "no_feasible_variant", at_s=103.0))
    log.listener(failure("digits", "invalid_input", at_s=104.0))  # bad rows: not a routing decision
    log.listener(failure("", "task_not_found", at_s=105.0))
    log.listener(answer("digits", "d/a", at_s=150.0))  # 51 s after its last answer: steady
    log.listener(answer("digits", "d/b", at_s=200.0))  # 102 s idle: starts again
    events = log.events()
    assert [(e.at_s, e.variant) for e in events] == [
        (0.0, "d/b"),
        (1.0, "d/a"),
        (100.0, "i/a"),
        (102.0, "-"),
        (200.0, "d/b"),
    ]
    assert all(e.kind == "route" for e in events)
    assert events[1].reason.startswith("digits routed to d/a (first answer: tenant acme")
    assert "no feasible variant" in events[3].reason
    assert "first answer in 60 s" in events[4].reason
    assert [e.at_s for e in log.events(limit=2)] == [102.0, 200.0]
    assert log.events(limit=0) == []


def test_the_log_is_bounded() -> None:
    log = RouteLog(maxlen=10, idle_s=1.0)
    for i in range(50):
        log.listener(answer("digits", "d/a", at_s=2.0 * i))
    assert len(log.events(limit=100)) == 10
    assert log.events(limit=100)[-1].at_s == 98.0
