"""What the CLI shows for registration and the zoo: a rich progress bar while building, and tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from infaas.types import Architecture, Profile, SkippedVariant, Variant
from variants.zoo import ZooResult

__all__ = ["BuildProgress", "models_table", "skipped_table", "variants_table", "zoo_table"]


class BuildProgress:
    """A `(message, done, total)` progress callback drawing one bar; use it as a context manager."""

    def __init__(self, console: Console, label: str) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[step]}"),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(label, total=None, step="")

    def __enter__(self) -> BuildProgress:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def __call__(self, message: str, done: int, total: int) -> None:
        self._progress.update(self._task, completed=done, total=total, step=message)


def models_table(archs: Sequence[Architecture], counts: dict[str, tuple[int, int]]) -> Table:
    table = Table(title="architectures")
    table.add_column("architecture", no_wrap=True)
    for col in ("task", "kind", "variants", "skipped", "owner", "description"):
        table.add_column(col, justify="right" if col in ("variants", "skipped") else "left")
    for a in archs:
        kept, skipped = counts.get(a.name, (0, 0))
        table.add_row(a.name, a.task, a.kind, str(kept), str(skipped), a.owner, a.description)
    return table


def variants_table(variants: Iterable[Variant], profiles: dict[str, Profile], title: str) -> Table:
    table = Table(title=title)
    table.add_column("variant", no_wrap=True)
    for col in ("max batch", "top-1 agree", "max |Δp|", "accuracy", "p99 @1 ms"):
        table.add_column(col, justify="right")
    for v in variants:
        prof = profiles.get(v.name)
        ok = prof is not None and prof.status == "ok"
        table.add_row(
            v.name,
            str(v.spec.max_batch),
            f"{v.parity.top1_agreement:.2%}",
            f"{v.parity.max_abs_diff:.2g}",
            f"{prof.accuracy:.2%}" if ok and prof is not None else "-",
            f"{prof.latency_ms(1):.3f}" if ok and prof is not None else "-",
        )
    return table


def skipped_table(skipped: Iterable[SkippedVariant]) -> Table:
    table = Table(title="not built")
    table.add_column("variant", no_wrap=True)
    table.add_column("reason", overflow="fold")
    for s in skipped:
        table.add_row(s.name, s.reason)
    return table


def zoo_table(results: Sequence[ZooResult]) -> Table:
    table = Table(title="model zoo")
    for col in ("architecture", "task", "status", "val. accuracy", "variants", "skipped", "seconds"):
        table.add_column(
            col, justify="right" if col in ("val. accuracy", "variants", "skipped", "seconds") else "left"
        )
    for r in results:
        res = r.result
        table.add_row(
            r.model.name,
            r.model.task,
            r.status,
            f"{r.accuracy:.1%}" if r.accuracy is not None else "-",
            str(len(res.variants)) if res else "-",
            str(len(res.skipped)) if res else "-",
            f"{r.seconds:.1f}" if r.status == "installed" else "-",
        )
    return table
