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


def test_only_changes_are_logged_with_their_reason() -> None:
    log = RouteLog()
    for i in range(100):
        log.listener(answer("digits", "d/a", at_s=float(i)))
    log.listener(answer("iris", "i/a", at_s=100.0))
    log.listener(answer("digits", "d/b", at_s=101.0, tenant="beta"))
    log.listener(failure("digits", "no_feasible_variant", at_s=102.0))
    log.listener(failure("digits", "no_feasible_variant", at_s=103.0))
    log.listener(failure("digits", "invalid_input", at_s=104.0))  # bad rows: not a routing decision
    log.listener(failure("", "task_not_found", at_s=105.0))
    log.listener(answer("digits", "d/b", at_s=106.0))
    events = log.events()
    assert [(e.at_s, e.variant) for e in events] == [
        (0.0, "d/a"),
        (100.0, "i/a"),
        (101.0, "d/b"),
        (102.0, "-"),
        (106.0, "d/b"),
    ]
    assert all(e.kind == "route" for e in events)
    assert "digits routed to d/b" in events[2].reason and "was d/a" in events[2].reason
    assert "tenant beta" in events[2].reason
    assert "no feasible variant" in events[3].reason
    assert "was" not in events[4].reason  # back after a failure, not a move between variants
    assert [e.at_s for e in log.events(limit=2)] == [102.0, 106.0]
    assert log.events(limit=0) == []


def test_the_log_is_bounded() -> None:
    log = RouteLog(maxlen=10)
    for i in range(50):
        log.listener(answer("digits", f"d/{i % 2}", at_s=float(i)))
    assert len(log.events(limit=100)) == 10
    assert log.events(limit=100)[-1].at_s == 49.0
