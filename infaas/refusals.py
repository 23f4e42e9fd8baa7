"""The errors a refused query gets (`policy.verdict`'s refusals, in words): what the client reads
in the 429's, 504's and 422's ``detail``, and the fields that let it act (the variant, the
predicted idle latency, the path's overhead, Retry-After, the alternatives)."""

from __future__ import annotations

from infaas.errors import DeadlineExceeded, InvalidInput, NoFeasibleVariant, Overloaded
from infaas.policy.selection import Choice, Infeasible
from infaas.types import SLO

__all__ = ["busy", "cold", "infeasible"]


def busy(
    task: str,
    slo: SLO,
    idle: Choice,
    queued_ms: float,
    path_ms: float,
    slowdown: float,
    elapsed_ms: float,
    head_ms: float | None = None,
) -> Overloaded | DeadlineExceeded:
    """Feasible on an idle fleet, not now: 429, or 504 if the deadline already passed. `head_ms`:
    what answers at the head of the fair queue took beyond their profile, where the query would
    have been one of them (`liveview.head_tracker`)."""
    if elapsed_ms >= slo.latency_ms:
        return DeadlineExceeded(
            f"the {slo.latency_ms:g} ms deadline passed after {elapsed_ms:.1f} ms, before the "
            "request was routed; it was not charged",
            waited_ms=round(elapsed_ms, 3),
        )
    # The path's measured overhead is the other half of "busy": after a stall it alone may
    # refuse a query whose queue is empty, and a message naming only the queue hid that.
    compute = f", and its batches run {slowdown:.1f}x their profile" if slowdown >= 1.05 else ""
    head = "" if head_ms is None else f"; answers at the head of its queue took ~{head_ms:.0f} ms beyond it"
    return Overloaded(
        f"{task}: the variants that meet the targets are busy: {idle.variant} would answer "
        f"in {idle.predicted_latency_ms:.1f} ms idle, but its queue adds ~{queued_ms:.0f} ms and "
        f"its path ~{path_ms:.0f} ms beyond its profile{compute}{head} (target {slo.latency_ms:g} ms); "
        "retry",
        task=task,
        variant=idle.variant,
        predicted_idle_ms=round(idle.predicted_latency_ms, 4),
        path_overhead_ms=round(path_ms, 3),
        slowdown=round(slowdown, 3),
        **({} if head_ms is None else {"head_ms": round(head_ms, 3)}),
        retry_after_s=round(max(queued_ms, 1.0) / 1000.0, 3),
    )


def cold(task: str, slo: SLO, choice: Choice, load_s: float) -> Overloaded:
    """Only a cold variant meets the targets, and its load (`load_s`) outlasts the target."""
    return Overloaded(
        f"{task}: {choice.variant} meets the targets but is not loaded, and loading it "
        f"(~{load_s * 1000:.0f} ms) would outlast the {slo.latency_ms:g} ms target; it is "
        "loading now: retry",
        task=task,
        variant=choice.variant,
        retry_after_s=round(max(load_s, 0.001), 3),
    )


def infeasible(
    result: Infeasible, task: str, slo: SLO, architecture: str | None
) -> InvalidInput | NoFeasibleVariant:
    """Nothing would meet the targets even on an idle fleet: 422 naming the nearest alternatives
    (400 when the query has more rows than any variant takes)."""
    scope = {"task": task} | ({"architecture": architecture} if architecture else {})
    if result.too_many_rows:
        if result.max_rows == 0:
            return NoFeasibleVariant(
                f"no profiled variant serves {task!r} yet; register or profile one", **scope
            )
        return InvalidInput(result.reason, rows=result.rows, max_rows=result.max_rows, **scope)
    alternatives = {
        "fastest_meeting_accuracy": result.fastest_at_accuracy,
        "most_accurate_meeting_latency": result.most_accurate_at_latency,
        "cheapest_meeting_latency_and_accuracy": result.cheapest_within_targets,
    }
    return NoFeasibleVariant(
        result.reason,
        targets={
            "latency_ms": slo.latency_ms,
            "min_accuracy": slo.min_accuracy,
            "max_cost_usd_per_1k": slo.max_cost_usd_per_1k,
        },
        alternatives={k: (a.as_dict() if a else None) for k, a in alternatives.items()},
        **scope,
    )
