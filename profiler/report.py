"""What the CLI shows while profiling (a rich progress bar) and after (a summary table)."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from infaas.types import MachineInfo, Profile
from profiler.machine import is_foreign

__all__ = ["RichProgress", "profile_table"]


class RichProgress:
    """A `ProfileProgress` that draws one bar over the variants; use it as a context manager."""

    def __init__(self, console: Console, total: int | None = None, label: str = "profiling") -> None:
        """`total` variants when known up front; None: each `profile_variants` call adds its own."""
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._label = label
        self._auto_total = total is None
        self._total = total or 0
        self._done = 0
        self._task = self._progress.add_task(label, total=total)
        self.failures = 0

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def started(self, variant: str, index: int, total: int) -> None:
        if self._auto_total and index == 0:
            self._total += total
        self._progress.update(self._task, total=self._total, description=f"{self._label} {variant}")

    def finished(self, profile: Profile, index: int, total: int) -> None:
        if profile.status != "ok":
            self.failures += 1
            self._progress.console.print(f"[red]failed[/] {profile.variant}: {profile.error}")
        self._done += 1
        self._progress.update(self._task, completed=self._done, description=self._label)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def profile_table(profiles: Iterable[Profile], local: MachineInfo, title: str = "profiles") -> Table:
    """One row per variant: latency at b=1 and b=32, best throughput, load, memory, accuracy,
    cost, how many points were stable, and a flag on profiles measured on another machine."""
    table = Table(title=title)
    for header in (
        "variant",
        "status",
        "p50 b=1 ms",
        "p99 b=1 ms",
        "p50 b=32 ms",
        "max rows/s",
        "load s",
        "mem MB",
        "accuracy",
        "$/1k b=1",
        "stable",
        "machine",
    ):
        justify = "left" if header in ("variant", "status", "machine") else "right"
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for p in sorted(profiles, key=lambda p: p.variant):
        machine = "other: " + p.machine.fingerprint if is_foreign(p, local) else "here"
        if p.status != "ok":
            table.add_row(p.variant, f"[red]failed[/]: {p.error or ''}"[:80], *["-"] * 9, machine)
            continue
        by_batch = {pt.batch: pt for pt in p.points}
        b1, b32 = by_batch.get(1), by_batch.get(32)
        table.add_row(
            p.variant,
            "ok",
            _ms(b1.p50_ms if b1 else None),
            _ms(b1.p99_ms if b1 else None),
            _ms(b32.p50_ms if b32 else None),
            f"{max(pt.throughput_qps for pt in p.points):,.0f}" if p.points else "-",
            f"{p.load_time_s:.3f}",
            f"{p.memory_mb:.1f}",
            f"{p.accuracy:.4f}",
            f"{p.cost_usd_per_1k(1):.2e}",
            f"{sum(pt.stable for pt in p.points)}/{len(p.points)}",
            machine,
        )
    return table
