"""Who caused the fleet's cost beyond what its answers were charged: reserved cost, attributed.

A tenant is charged per answer (`metering.cost_share_pusd`: its rows' share of the batch's
measured cost). The fleet costs more than that: replicas held between batches, warm floors, the
spare capacity kept for bursts and tight targets. Each accounting interval (the autoscaler's
round), for each variant:

    reserved = what the variant's replicas cost in the interval − what its answers were charged

and that amount, in integer pico-dollars, is split among the tenants in proportion to the rows
they sent to the variant's architecture over the last `horizon_s` (the warm floor's TTL: a
replica kept warm is kept for whoever used the architecture within it), by largest remainder, so
the parts add up exactly. With no such traffic the operator (`OPERATOR`, the admin key's name)
carries it: a floor nobody has used yet. A variant charged more than its replicas cost in an
interval (its batches ran longer than their profile's mean, which prices them) gives the
difference back in the same proportions. Hence, over any run of intervals, for the fleet:

    Σ tenants (charged + reserved) = Σ variants what their replicas cost

Pure bookkeeping: times and amounts come in as arguments.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Mapping

__all__ = ["OPERATOR", "ReservedCost", "apportion"]

OPERATOR = "admin"
"""Who carries reserved cost no tenant's traffic explains (the reserved tenant name)."""


def apportion(amount: int, weights: Mapping[str, float]) -> dict[str, int]:
    """`amount` split in proportion to the positive `weights`, in integers that add up to it
    exactly (largest remainder; ties to the name that sorts first). Negative amounts too."""
    positive = {k: w for k, w in weights.items() if w > 0}
    if not positive or amount == 0:
        return {}
    total = math.fsum(positive.values())
    sign, magnitude = (1, amount) if amount > 0 else (-1, -amount)
    exact = {k: magnitude * w / total for k, w in positive.items()}
    parts = {k: math.floor(v) for k, v in exact.items()}
    left = magnitude - sum(parts.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - parts[k]), k))[:left]:
        parts[k] += 1
    return {k: sign * v for k, v in parts.items() if v}


class ReservedCost:
    """The interval's charges and the architectures' recent traffic; `close` attributes."""

    def __init__(self, horizon_s: float = 3600.0, bucket_s: float = 60.0) -> None:
        self.horizon_s = horizon_s
        self._bucket_s = bucket_s
        self._charged: dict[str, int] = defaultdict(int)  # variant → pusd charged this interval
        # architecture → tenant → deque of (bucket start, rows)
        self._rows: dict[str, dict[str, deque[tuple[float, int]]]] = defaultdict(dict)

    def charged(self, tenant: str, variant: str, rows: int, cost_pusd: int, now_s: float) -> None:
        """An answer (or an offline chunk) charged `cost_pusd` for `rows` rows on `variant`."""
        self._charged[variant] += cost_pusd
        arch = variant.split("/", 1)[0]
        buckets = self._rows[arch].setdefault(tenant, deque())
        start = now_s - now_s % self._bucket_s
        if buckets and buckets[-1][0] == start:
            buckets[-1] = (start, buckets[-1][1] + rows)
        else:
            buckets.append((start, rows))

    def weights(self, architecture: str, now_s: float) -> dict[str, float]:
        """Rows per tenant on `architecture` within the horizon (older buckets are dropped)."""
        out: dict[str, float] = {}
        tenants = self._rows.get(architecture, {})
        for tenant in list(tenants):
            buckets = tenants[tenant]
            while buckets and buckets[0][0] + self._bucket_s <= now_s - self.horizon_s:
                buckets.popleft()
            if buckets:
                out[tenant] = float(sum(rows for _, rows in buckets))
            else:
                del tenants[tenant]
        return out

    def close(self, fleet_pusd: Mapping[str, int], now_s: float) -> dict[tuple[str, str], int]:
        """End the interval: (tenant, variant) → reserved pico-dollars, for every variant that
        cost or was charged something in it. Charges on variants with no fleet cost (not in
        `fleet_pusd`) are given back like any other excess."""
        out: dict[tuple[str, str], int] = {}
        for variant in sorted(set(fleet_pusd) | set(self._charged)):
            reserved = fleet_pusd.get(variant, 0) - self._charged.get(variant, 0)
            if reserved == 0:
                continue
            weights = self.weights(variant.split("/", 1)[0], now_s) or {OPERATOR: 1.0}
            for tenant, part in apportion(reserved, weights).items():
                out[(tenant, variant)] = part
        self._charged.clear()
        return out
