"""The variants a simulation serves: from a data dir's store, or a synthetic zoo.

A `Zoo` is the catalog the router's snapshot holds (variants with their usable profiles, the task
of each architecture); the simulator builds the same `VariantTable`s from it that the router does.

The synthetic zoo stands in for hundreds of profiled variants when there are none (scale runs):
per architecture a compute cost drawn log-uniformly and an accuracy that grows with it (bigger
models are slower and more accurate), and per variant a runtime, precision and thread count that
scale latency, accuracy and price the way the measured variants do in `docs/benchmarks.md`
(int8 faster and slightly less accurate, more threads faster and dearer per second). Latency is
linear in the batch size with a fixed part, so batching pays, as it does on the real runtimes.

With `gpu=True` each architecture also has an ONNX Runtime CUDA fp32 and fp16 variant, profiled on
a GPU machine class (`SYNTHETIC_GPU_MACHINE`). Their shape is the one `scripts/gpu_check` measured
on an H200 (docs/benchmarks.md, "GPU variant paths"): a fixed ~0.07 ms per batch (launch and
host↔device copies) that dominates small models, a compute part 20× shorter than one CPU core's
(1.50 ms → 0.075 ms at 128 rows on the 1024-wide MLP) and rows almost free (200× less per row), up
to 128 rows a batch. A replica is priced at one GPU of the profiler's default price table (an
NVIDIA T4 hour, $0.35), what `profiler.cost.price_usd_per_s` charges a GPU variant; a GPU model
faster than the T4 at that price makes GPUs look cheaper than they are: an assumption to keep in
mind when reading a mixed-fleet result.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infaas.sim.traces import TenantSpec
from infaas.types import (
    SLO,
    LatencyPoint,
    MachineInfo,
    Parity,
    Precision,
    Profile,
    RuntimeName,
    Variant,
    VariantSpec,
)

__all__ = ["SYNTHETIC_GPU_MACHINE", "Zoo", "from_store", "mixed_tenants", "synthetic_zoo"]

SYNTHETIC_MACHINE = MachineInfo(cpu_model="synthetic", cores=8)
SYNTHETIC_GPU_MACHINE = MachineInfo(cpu_model="synthetic", cores=8, gpu="synthetic-gpu")
USD_PER_CORE_S = 0.045 / 3600.0  # a cloud vCPU-hour
USD_PER_GPU_S = 0.35 / 3600.0  # a GPU-hour: `profiler.cost.DEFAULT_PRICE_TABLE` (NVIDIA T4)
GPU_LAUNCH_MS = 0.07  # H200, p50 at 1-8 rows of a small MLP, copies included
GPU_SPEEDUP = 20.0  # the compute part against one CPU core
GPU_ROW_SPEEDUP = 200.0  # each further row's part
GPU_MAX_BATCH = 128
_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
_RUNTIMES: tuple[tuple[RuntimeName, float], ...] = (("onnxruntime", 1.0), ("tensorflow", 1.6))
_PRECISIONS: tuple[tuple[Precision, float, float], ...] = (
    ("fp32", 1.0, 0.0),
    ("fp16", 0.85, 0.002),
    ("int8", 0.55, 0.012),
)
_GPU_PRECISIONS: tuple[tuple[Precision, float, float], ...] = (("fp32", 1.0, 0.0), ("fp16", 0.6, 0.002))
_THREADS = (1, 2, 4)


@dataclass(frozen=True)
class Zoo:
    """Profiled variants by name, and the task of each architecture."""

    variants: dict[str, tuple[Variant, Profile]]
    tasks: dict[str, str]  # architecture → task

    def cpu_only(self) -> Zoo:
        """The same zoo without its GPU variants (what a CPU-only cluster's router may use)."""
        return Zoo(
            variants={n: vp for n, vp in self.variants.items() if vp[0].spec.hardware != "gpu"},
            tasks=self.tasks,
        )

    def by_task(self) -> dict[str, list[tuple[Variant, Profile]]]:
        out: dict[str, list[tuple[Variant, Profile]]] = {}
        for variant, profile in self.variants.values():
            out.setdefault(self.tasks[variant.architecture], []).append((variant, profile))
        return out


def _profile(
    variant: Variant,
    base_ms: float,
    accuracy: float,
    load_time_s: float,
    per_row_ms: float | None = None,
    machine: MachineInfo = SYNTHETIC_MACHINE,
    price_usd_per_s: float | None = None,
) -> Profile:
    if per_row_ms is None:
        per_row_ms = 0.12 * base_ms  # the fixed part dominates one row: batching raises throughput

    def p50(b: int) -> float:
        return base_ms + per_row_ms * (b - 1)

    points = tuple(
        LatencyPoint(
            batch=b,
            p50_ms=p50(b),
            p95_ms=1.15 * p50(b),
            p99_ms=1.3 * p50(b),
            mean_ms=1.05 * p50(b),
            throughput_qps=1000.0 * b / p50(b),
            samples=100,
            stable=True,
            stop_reason="stable",
            cost_usd_per_1k=0.0,
        )
        for b in _BATCHES
        if b <= variant.spec.max_batch
    )
    return Profile(
        variant=variant.name,
        machine=machine,
        measured_at_s=0.0,
        points=points,
        fit_intercept_ms=base_ms - per_row_ms,
        fit_slope_ms=per_row_ms * 1.3,
        load_time_s=load_time_s,
        accuracy=accuracy,
        price_usd_per_s=variant.spec.threads * USD_PER_CORE_S if price_usd_per_s is None else price_usd_per_s,
    )


def synthetic_zoo(
    tasks: int, variants_per_task: int, seed: int = 0, max_batch: int = 32, gpu: bool = False
) -> Zoo:
    """`tasks` tasks of `variants_per_task` CPU variants each, reproducible from `seed`. Each
    architecture has up to 18 CPU variants (2 runtimes × 3 precisions × 3 thread counts), and with
    `gpu` two GPU variants more (fp32, fp16; the CPU ones are the same with or without)."""
    if tasks < 1 or variants_per_task < 1:
        raise ValueError("tasks and variants_per_task must be at least 1")
    rng = np.random.default_rng(seed)
    combos = list(itertools.product(_RUNTIMES, _PRECISIONS, _THREADS))
    per_arch = min(len(combos), 10)
    variants: dict[str, tuple[Variant, Profile]] = {}
    arch_task: dict[str, str] = {}
    for t in range(tasks):
        task = f"task{t}"
        n_arch = math.ceil(variants_per_task / per_arch)
        left = variants_per_task
        for a in range(n_arch):
            arch = f"{task}-arch{a}"
            arch_task[arch] = task
            compute_ms = float(math.exp(rng.uniform(math.log(0.4), math.log(25.0))))
            # Accuracy rises with log compute (0.70 at the cheapest, ~0.97 at the dearest), with noise.
            span = (math.log(compute_ms) - math.log(0.4)) / (math.log(25.0) - math.log(0.4))
            accuracy = float(np.clip(0.70 + 0.27 * span + rng.normal(0.0, 0.01), 0.5, 0.995))
            load_time_s = 0.3 + 0.15 * compute_ms
            picks = rng.permutation(len(combos))[: min(per_arch, left)]
            left -= len(picks)
            for k in picks:
                (runtime, rt_factor), (precision, p_factor, acc_loss), threads = combos[int(k)]
                spec = VariantSpec(
                    architecture=arch,
                    runtime=runtime,
                    precision=precision,
                    threads=threads,
                    max_batch=max_batch,
                )
                variant = _variant(spec, acc_loss)
                base_ms = compute_ms * rt_factor * p_factor / threads**0.7
                variants[variant.name] = (
                    variant,
                    _profile(variant, base_ms, accuracy - acc_loss, load_time_s),
                )
            if gpu:
                for variant, profile in _gpu_variants(arch, compute_ms, accuracy, load_time_s):
                    variants[variant.name] = (variant, profile)
    return Zoo(variants=variants, tasks=arch_task)


def _variant(spec: VariantSpec, acc_loss: float) -> Variant:
    return Variant(
        spec=spec,
        artifact="synthetic",
        sha256="0" * 64,
        parity=Parity(top1_agreement=1.0 - acc_loss, max_abs_diff=0.0, samples=1),
    )


def _gpu_variants(
    arch: str, compute_ms: float, accuracy: float, load_time_s: float
) -> list[tuple[Variant, Profile]]:
    """An architecture's CUDA fp32 and fp16 variants (module docstring: the GPU class's shape)."""
    out: list[tuple[Variant, Profile]] = []
    for precision, p_factor, acc_loss in _GPU_PRECISIONS:
        spec = VariantSpec(
            architecture=arch,
            runtime="onnxruntime",
            hardware="gpu",
            precision=precision,
            max_batch=GPU_MAX_BATCH,
        )
        variant = _variant(spec, acc_loss)
        compute = compute_ms * p_factor
        profile = _profile(
            variant,
            GPU_LAUNCH_MS + compute / GPU_SPEEDUP,
            accuracy - acc_loss,
            load_time_s + 1.0,  # a CUDA context and the weights' upload
            per_row_ms=0.12 * compute / GPU_ROW_SPEEDUP,
            machine=SYNTHETIC_GPU_MACHINE,
            price_usd_per_s=USD_PER_GPU_S,
        )
        out.append((variant, profile))
    return out


def from_store(data_dir: str) -> Zoo:
    """The variants of a data dir's store with the profiles usable on this machine, as the
    router's snapshot reads them (foreign and failed profiles left out)."""
    from infaas.settings import Settings
    from infaas.snapshot import Snapshot
    from infaas.store import open_store

    store = open_store(Settings(data_dir=data_dir))  # type: ignore[arg-type]
    snap = Snapshot.load(store)
    usable = {name: (v, p) for name, (v, p) in snap.variants.items() if p is not None}
    return Zoo(variants=usable, tasks={a.name: a.task for a in snap.architectures.values()})


def _fastest_p99(entries: Sequence[tuple[Variant, Profile]], rows: int, min_accuracy: float) -> float:
    fits = [
        p.latency_ms(rows, "p99")
        for v, p in entries
        if p.accuracy >= min_accuracy and v.spec.max_batch >= rows
    ]
    return min(fits) if fits else min(p.latency_ms(rows, "p99") for _, p in entries)


def mixed_tenants(zoo: Zoo, overhead_ms: float = 0.9) -> list[TenantSpec]:
    """A mixed-SLO tenant mix per task, with targets set from the task's own profiles so that
    every class is feasible on an idle fleet at any zoo scale:

    - *interactive* (half the traffic): median accuracy, 3× the fastest such variant's p99;
    - *accurate* (a fifth): the 90th-percentile accuracy, 4× its fastest p99;
    - *bulk* (the rest): 8-row queries at the 10th-percentile accuracy, 8× its fastest p99."""
    mix: list[TenantSpec] = []
    for task, entries in sorted(zoo.by_task().items()):
        accs = np.array(sorted(p.accuracy for _, p in entries))
        for name, q, rows, factor, share in (
            ("interactive", 0.5, 1, 3.0, 0.5),
            ("accurate", 0.9, 1, 4.0, 0.2),
            ("bulk", 0.1, 8, 8.0, 0.3),
        ):
            acc = float(np.quantile(accs, q, method="lower"))
            rows_ok = min(rows, max(v.spec.max_batch for v, _ in entries))
            target = factor * _fastest_p99(entries, rows_ok, acc) + overhead_ms
            SLO(latency_ms=target, min_accuracy=acc)  # validated here, not at the first query
            mix.append(TenantSpec(f"{task}/{name}", task, round(target, 3), acc, rows_ok, share))
    return mix
