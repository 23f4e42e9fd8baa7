"""Version labels and the canary split: pure functions over `Labels`, no I/O.

An architecture's versions carry two labels, TF Serving style: `stable` (what the architecture's
traffic gets) and `canary` (a new version that takes a fixed share of that traffic). The transitions
here return new `Labels` or raise the error the API answers; `infaas.versions` applies them (loads
and warms before a switch, drains and unloads after it)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from infaas.errors import Conflict, InvalidInput
from infaas.types import Labels, VersionState

__all__ = [
    "CanarySplit",
    "accuracy_guard",
    "end_canary",
    "promote",
    "remove_version",
    "rollback",
    "set_canary",
    "version_states",
]


def _routable(labels: Labels, version: int, known: set[int]) -> None:
    if version not in known:
        raise InvalidInput(
            f"{labels.architecture} has no version {version} (versions: {sorted(known)})",
            architecture=labels.architecture,
            version=version,
        )
    state = labels.state(version)
    if state in ("loading", "failed"):
        raise Conflict(
            f"{labels.architecture} version {version} is {state}: it cannot take traffic",
            architecture=labels.architecture,
            version=version,
            state=state,
        )


def set_canary(labels: Labels, version: int, share: float, known: set[int]) -> Labels:
    """`version` takes `share` (0 < share < 1) of the architecture's traffic."""
    if not 0.0 < share < 1.0:
        raise InvalidInput(f"a canary's share must lie in (0, 1); got {share:g}", share=share)
    if version == labels.stable:
        raise Conflict(
            f"version {version} of {labels.architecture} is already stable",
            architecture=labels.architecture,
            version=version,
        )
    _routable(labels, version, known)
    states = _unlabelled(labels, labels.canary)
    states.pop(version, None)
    return labels.model_copy(update={"canary": version, "canary_share": share, "states": states})


def end_canary(labels: Labels) -> Labels:
    """Stop the canary: its version goes back to `ready` (routable only when pinned)."""
    if labels.canary is None:
        raise Conflict(f"{labels.architecture} has no canary", architecture=labels.architecture)
    return labels.model_copy(
        update={"canary": None, "canary_share": 0.0, "states": _unlabelled(labels, labels.canary)}
    )


def promote(labels: Labels, version: int | None, known: set[int]) -> Labels:
    """`version` (default: the canary) becomes stable; the stable it replaces is retired and
    remembered for `rollback`."""
    target = labels.canary if version is None else version
    if target is None:
        raise Conflict(
            f"{labels.architecture} has no canary to promote: name a version",
            architecture=labels.architecture,
        )
    if target == labels.stable:
        raise Conflict(
            f"version {target} of {labels.architecture} is already stable",
            architecture=labels.architecture,
            version=target,
        )
    _routable(labels, target, known)
    states: dict[int, VersionState] = dict(labels.states)
    states[labels.stable] = "retired"
    states.pop(target, None)
    canary = None if labels.canary == target else labels.canary
    return labels.model_copy(
        update={
            "stable": target,
            "canary": canary,
            "canary_share": labels.canary_share if canary is not None else 0.0,
            "previous": (*labels.previous, labels.stable),
            "states": states,
        }
    )


def rollback(labels: Labels, known: set[int]) -> Labels:
    """The stable before the current one becomes stable again; the current one is retired. A
    canary is dropped: what went wrong may be in it too."""
    previous = [v for v in labels.previous if v in known and labels.state(v) != "failed"]
    if not previous:
        raise Conflict(
            f"{labels.architecture} has no earlier stable version to roll back to",
            architecture=labels.architecture,
        )
    back = previous[-1]
    states = _unlabelled(labels, labels.canary)
    states[labels.stable] = "retired"
    states.pop(back, None)
    return labels.model_copy(
        update={
            "stable": back,
            "canary": None,
            "canary_share": 0.0,
            "previous": tuple(previous[:-1]),
            "states": states,
        }
    )


def remove_version(labels: Labels, version: int) -> Labels:
    """Forget a deleted version. The stable version cannot go while others remain (promote or
    roll back first); a deleted canary ends the canary."""
    if version == labels.stable:
        raise Conflict(
            f"version {version} is {labels.architecture}'s stable version: promote or roll back "
            "to another first, or delete the whole architecture",
            architecture=labels.architecture,
            version=version,
        )
    states: dict[int, VersionState] = dict(labels.states)
    states.pop(version, None)
    errors = {v: e for v, e in labels.errors.items() if v != version}
    canary = None if labels.canary == version else labels.canary
    return labels.model_copy(
        update={
            "canary": canary,
            "canary_share": labels.canary_share if canary is not None else 0.0,
            "previous": tuple(v for v in labels.previous if v != version),
            "states": states,
            "errors": errors,
        }
    )


def _unlabelled(labels: Labels, version: int | None) -> dict[int, VersionState]:
    states: dict[int, VersionState] = dict(labels.states)
    if version is not None:
        states[version] = "ready"
    return states


def version_states(labels: Labels, stored: Iterable[int]) -> dict[int, VersionState]:
    """Every version's state, by number: the `stored` ones by their labels, plus those that never
    became an architecture (still `loading`, or `failed` with the reason in `labels.errors`)."""
    states = {v: labels.state(v) for v in stored}
    for v, state in labels.states.items():
        if v not in states and state in ("loading", "failed"):
            states[v] = state
    return dict(sorted(states.items()))


def accuracy_guard(candidate: float, stable: float, tolerance: float) -> str | None:
    """Why a promotion must be refused (the candidate is measurably worse), or None."""
    if candidate + tolerance < stable:
        return (
            f"the candidate's accuracy {candidate:.4f} is below the stable version's {stable:.4f} by "
            f"{stable - candidate:.4f}, more than the {tolerance:g} tolerance "
            "(INFAAS_PROMOTE_ACCURACY_TOLERANCE); the admin can force the promotion"
        )
    return None


@dataclass
class _Counts:
    share: float
    queries: int = 0
    canary: int = 0


class CanarySplit:
    """Deterministic split of an architecture's queries: query n (from 0) goes to the canary when
    ``floor((n + 1) · share) > floor(n · share)``, so after any n queries the canary has had
    exactly ``floor(n · share)`` of them. Counts restart when the share or the canary changes."""

    def __init__(self) -> None:
        self._counts: dict[str, _Counts] = {}

    def take(self, line: str, canary: int, share: float) -> bool:
        key = f"{line}@{canary}"
        counts = self._counts.get(key)
        if counts is None or counts.share != share:
            counts = self._counts[key] = _Counts(share)
        n = counts.queries
        counts.queries += 1
        if math.floor((n + 1) * share + 1e-9) > math.floor(n * share + 1e-9):
            counts.canary += 1
            return True
        return False

    def missed(self, line: str, canary: int) -> None:
        """The canary was due but could not take the query (infeasible there): it went to stable."""
        counts = self._counts.get(f"{line}@{canary}")
        if counts is not None and counts.canary > 0:
            counts.canary -= 1

    def observed(self, line: str, canary: int) -> tuple[int, int]:
        """(queries of the architecture, of which to the canary) since this canary's share was set."""
        counts = self._counts.get(f"{line}@{canary}")
        return (0, 0) if counts is None else (counts.queries, counts.canary)
