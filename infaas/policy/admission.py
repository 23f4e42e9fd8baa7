"""How many admitted queries one front end keeps in flight: a limit learned from late answers
(pure: outcomes and the clock come in as arguments).

Admission (the router) predicts each query's latency from profiles, queues and the path's
measured overhead, and refuses what it predicts late. Under overload those predictions fail
together: every step of an admitted query waits for an event-loop iteration, and an iteration
grows with the queries in flight (a batch of 16 answers comes back at once, and their handlers,
replies and journal records run back to back). Measured in the overload test (2026-12-04, one
front end at 2× what it sustains): the late answers had been predicted at 34 ms p50 for a 50 ms
target and answered in 71 ms — queue 20 ms, batch round trip 14 ms, back to the handler 9 ms,
journal 27 ms — while the answers in time had 1.3 ms of queue.

So admission also holds the number of queries in flight under a limit that follows the answers'
verdicts, as TCP's window follows losses (additive increase, multiplicative decrease): an answer
in time raises it by 1/limit while the limit is full (TCP grows only a window in use), a late answer (or
one dropped at its deadline) cuts it by `backoff`, at most once per `cooldown_s` (the late answers
of one slow batch are one signal). It never falls below `min_limit`: a few clients never meet it,
whatever their targets (a client trying near-edge targets gets some late answers on any host).

`late_for_load` is the verdict. An answer counts as late for the load when it missed its target
though predicted with a fifth of it to spare, and also when it came more than a quarter of its
target after its prediction, in time or not: queues grow before they miss, and a limit cut on
misses alone cuts after the damage.

Both rules came from the overload test (2026-12-04, an AMD EPYC, 2× what the front end
sustains, 50 ms targets after 2 000 queries from 64 clients with 60 s targets). Grown while half
full, the limit rose from 64 to ~95 under those 64 lenient clients, let in the first ~130
overload queries at once (predicted at 8 ms, answered in 54) and gave 96.7 and 97.2 % of admitted
answers in SLO; with the early verdict too, 98.1-98.8 % (3 runs); with both rules, 99.6 and
99.9 % at 1 146 and 1 356 answered/s, the same throughput.
"""

from __future__ import annotations

from infaas.policy.verdict import Standing, over_share

__all__ = ["ConcurrencyLimit", "RateQuota", "late_for_load"]


def late_for_load(latency_ms: float, target_ms: float, predicted_ms: float, queued_ms: float = 0.0) -> bool:
    """Whether an answer tells the limit the front end holds too many queries (module docstring).
    A miss by a target at the edge of its prediction is the prediction's noise, on any host:
    counted, one tenant's near-edge targets would cut every tenant's limit. Unless it was
    predicted to wait (`queued_ms`) a quarter of its target or more behind other queries: then a
    shorter queue would have met it. Under a sustained overload admission fills the queue to
    the edge of the target, and the noise of those edge predictions made 1-6 % of the answers
    late while the limit stood still (load step and 10x overload, 2026-12-05)."""
    if latency_ms - predicted_ms > 0.25 * target_ms:
        return True
    if latency_ms <= target_ms:
        return False
    return predicted_ms <= 0.8 * target_ms or queued_ms >= 0.25 * target_ms


class ConcurrencyLimit:
    """See the module docstring. `try_admit` takes a slot, `release` gives it back with the verdict.

    Shared by tenants in weighted fair shares (max-min, as a fair queue shares a link): a tenant
    holding fewer queries than its share of the limit (``limit × weight / Σ weights`` of the
    tenants active in the last `active_s`, rounded down, at least one) is admitted even when the
    limit is full, by borrowing from those over theirs; a tenant at or over its share is admitted
    only while the limit has room. So the tenant over its share gets the refusals, and one within
    it is never refused because another exceeds its own. The total can pass the limit by the
    shares in use: at most the limit again, plus one per active tenant."""

    def __init__(
        self,
        *,
        initial: float = 64.0,
        min_limit: float = 8.0,
        max_limit: float = 4096.0,
        backoff: float = 0.8,
        cooldown_s: float = 0.05,
        active_s: float = 1.0,
    ) -> None:
        if not 1.0 <= min_limit <= initial <= max_limit:
            raise ValueError("need 1 <= min_limit <= initial <= max_limit")
        if not 0.0 < backoff < 1.0 or cooldown_s < 0.0 or active_s <= 0.0:
            raise ValueError("backoff in (0, 1), cooldown_s >= 0, active_s > 0")
        self._min = min_limit
        self._max = max_limit
        self._backoff = backoff
        self._cooldown_s = cooldown_s
        self._active_s = active_s
        self.limit = initial
        self.in_flight = 0
        self._cut_s = float("-inf")
        self._held: dict[str, int] = {}  # tenant → slots held
        self._seen: dict[str, tuple[float, float]] = {}  # tenant → (last arrival s, weight)

    @property
    def full(self) -> bool:
        """Whether the limit is reached: a query arriving now is refused unless its tenant is
        under its share (`over_share`)."""
        return self.in_flight >= int(self.limit)

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def share(self, tenant: str, weight: float, now_s: float) -> float:
        """`tenant`'s fair share of the limit now: its weight's part of the active tenants'."""
        total = weight
        horizon_s = now_s - self._active_s
        stale = []
        for other, (seen_s, other_weight) in self._seen.items():
            if other == tenant:
                continue
            if seen_s >= horizon_s or self._held.get(other):
                total += other_weight
            else:
                stale.append(other)
        for other in stale:
            del self._seen[other]
        return self.limit * weight / total

    def standing(self, tenant: str, weight: float, now_s: float, quota_wait_s: float = 0.0) -> Standing:
        """`tenant`'s standing under the limit now, what `policy.verdict` judges."""
        full = self.full
        share = max(1, int(self.share(tenant, weight, now_s))) if full else int(self.limit)
        return Standing(self._held.get(tenant, 0), share, full, quota_wait_s)

    def over_share(self, tenant: str, weight: float, now_s: float) -> bool:
        """Whether a query of `tenant` arriving now is refused: the limit is full and the tenant
        already holds its share of it (the door asks, before reading the query)."""
        return self.full and over_share(self.standing(tenant, weight, now_s))

    def try_admit(self, tenant: str = "", weight: float = 1.0, now_s: float = 0.0) -> bool:
        """Take a slot for a query of `tenant`, or False: it is over its share of a full limit."""
        self._seen[tenant] = (now_s, weight)
        if self.over_share(tenant, weight, now_s):
            return False
        self.take(tenant, weight, now_s)
        return True

    @property
    def crowded(self) -> bool:
        """Whether half the limit or more is in use (what `release` asks of an admission)."""
        return self.in_flight >= 0.5 * self.limit

    def take(self, tenant: str, weight: float, now_s: float) -> None:
        """Take a slot for a query the verdict admitted."""
        self._seen[tenant] = (now_s, weight)
        self.in_flight += 1
        self._held[tenant] = self._held.get(tenant, 0) + 1

    def release(self, late: bool | None, now_s: float, tenant: str = "", crowded: bool = True) -> None:
        """Give back `tenant`'s slot: `late` is the verdict (None: no answer that says anything
        about the load, e.g. refused by the router after the slot was taken). `crowded`: whether
        the query was admitted with half the limit or more in use (`crowded`), or was predicted
        to wait a quarter of its target or more behind other queries.

        A late answer cuts the limit only if crowded: a query that found the front end nearly
        empty and nothing ahead of it is not late because the front end holds too many, and
        cutting on those answers (a stall of the shared host, a neighbour on the core) brought the
        limit down to its floor at a fraction of what the service sustains; MLPerf's Poisson
        bursts then met 429s at a p99 well under their bound (issue 32). A query that waited a
        quarter of its target in a queue counts whatever the limit's use: a compute-bound
        variant's queue fills with a few queries in flight (the load step's late answers came
        from there). Any queue at all was too wide a net: a 1.4 ms model behind a Ray hop has a
        batch in flight at most arrivals, and MLPerf's 15 ms bound then met 429s from 325 QPS."""
        if late and not crowded:
            late = None
        self.in_flight = max(0, self.in_flight - 1)
        held = self._held.get(tenant, 0) - 1
        if held > 0:
            self._held[tenant] = held
        else:
            self._held.pop(tenant, None)
        if late:
            if now_s - self._cut_s >= self._cooldown_s:
                self._cut_s = now_s
                self.limit = max(self._min, self.limit * self._backoff)
        elif late is not None and self.in_flight + 1 >= int(self.limit):
            # Raised only while the limit is what holds the traffic back (the slot given back was
            # its last): clients that never fill it must not grow it without bound, nor to what
            # their lenient targets allow and another tenant's strict ones do not.
            self.limit = min(self._max, self.limit + 1.0 / self.limit)


class RateQuota:
    """A tenant's optional rate quota: a token bucket of `rate_qps` tokens a second holding at
    most `burst` (default one second's worth). Pure: the clock comes in as `now_s`."""

    __slots__ = ("_last_s", "burst", "rate_qps", "tokens")

    def __init__(self, rate_qps: float, burst: float | None = None, now_s: float = 0.0) -> None:
        if rate_qps <= 0.0:
            raise ValueError("rate_qps must be > 0")
        self.rate_qps = rate_qps
        self.burst = max(1.0, burst if burst is not None else rate_qps)
        self.tokens = self.burst
        self._last_s = now_s

    def _fill(self, now_s: float) -> None:
        if now_s > self._last_s:
            self.tokens = min(self.burst, self.tokens + (now_s - self._last_s) * self.rate_qps)
            self._last_s = now_s

    @property
    def empty(self) -> bool:
        """Out of tokens at the last call (the door then looks at this tenant's queries)."""
        return self.tokens < 1.0

    def wait_s(self, now_s: float) -> float:
        """Seconds until a token is due (0.0: one is there), taking none."""
        self._fill(now_s)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate_qps

    def take(self, now_s: float) -> float:
        """Take a token: 0.0, or the seconds until one is due (the query is refused)."""
        self._fill(now_s)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_qps
