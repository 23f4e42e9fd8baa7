"""The `infaas` command. Each command builds `Settings` once and passes it down."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from infaas.settings import Settings

if TYPE_CHECKING:
    from infaas.store import MetadataStore

__all__ = ["app", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=False, help="infaas: model-less inference.")
console = Console()


def load_settings() -> Settings:
    return Settings()


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Bind address (default: INFAAS_HOST or 127.0.0.1)."),
    port: int | None = typer.Option(None, help="Port (default: INFAAS_PORT or 8000)."),
    demo: bool = typer.Option(False, "--demo", help="(Re)create tenant 'demo' and print a query to paste."),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        help="Front-end processes sharing the port and one fleet (default: one per 4 cores).",
    ),
    reuse_port: bool = typer.Option(False, "--reuse-port", hidden=True, help="Bind with SO_REUSEPORT."),
) -> None:
    """Run the service in the foreground."""
    from infaas.api.auth import ensure_admin_key
    from infaas.supervisor import default_front_ends, serve_front_ends

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # for TensorFlow, not read by infaas
    front_ends = workers if workers is not None else default_front_ends()
    url = f"http://{settings.host}:{settings.port}"
    if not reuse_port:  # a front end started by `--workers N` leaves the banner to its supervisor
        admin = ensure_admin_key(settings)
        how = f", {front_ends} front ends" if front_ends > 1 else ""
        console.print(f"[bold green]infaas[/] serving on [bold]{url}[/]  (data: {settings.data_dir}{how})")
        console.print(f"admin key: [bold]{admin}[/]  (also in {settings.admin_key_path})")
        console.print(f"dashboard: {url}/dashboard   metrics: {url}/metrics   API docs: {url}/docs")
        _print_first_steps(settings, url, demo)
    if front_ends > 1:
        code = serve_front_ends(settings, front_ends)
    else:
        from infaas.api import create_app
        from infaas.api.lifecycle import run

        code = run(create_app(settings), settings, reuse_port=reuse_port)
    if code:
        raise typer.Exit(code)
    if not reuse_port:
        console.print("infaas stopped: requests drained, usage flushed")


def _print_first_steps(settings: Settings, url: str, demo: bool) -> None:
    if not demo:
        console.print(f"create a tenant: POST {url}/v1/admin/tenants with the admin key")
        return
    from infaas.store import open_store

    store = open_store(settings)
    try:
        key = _demo_tenant_key(store)
    finally:
        store.close()
    row = _example_digit_row()
    body = {"task": "digits-classification", "inputs": [row], "latency_ms": 20, "min_accuracy": 0.95}
    console.print("tenant [bold]demo[/] key: " + key)
    console.print("try (a real 8×8 digit; infaas picks the cheapest variant meeting 20 ms and 95 %):")
    console.print(
        f"  curl -s -X POST {url}/v1/query -H 'Authorization: Bearer {key}' "
        f"-H 'Content-Type: application/json' -d '{json.dumps(body)}'",
        soft_wrap=True,
    )


def _demo_tenant_key(store: MetadataStore) -> str:
    """A fresh key for tenant 'demo': keys are shown once, so a restart revokes and re-creates it."""
    import time

    from infaas.api.auth import new_api_key
    from infaas.types import Tenant

    existing = store.get_tenant("demo")
    if existing is not None and not existing.revoked:
        store.revoke_tenant("demo")
    key = new_api_key()
    store.create_tenant(Tenant(name="demo", created_at_s=time.time()), key)
    return key


def _example_digit_row() -> list[float]:
    """A held-out row of the zoo's digits test split, scaled as the zoo models expect."""
    from variants.zoo import DIGITS, load_split

    return [round(float(v), 4) for v in load_split(DIGITS).x_test[0]]


@app.command("fleet-down")
def fleet_down() -> None:
    """Stop the shared fleet on INFAAS_RAY_ADDRESS: its workers outlive every front end (detached)."""
    from infaas.workers.ray_pool import stop_fleet

    settings = load_settings()
    if not settings.shared_fleet:
        console.print("[red]error:[/] set INFAAS_RAY_ADDRESS to the cluster whose fleet to stop")
        raise typer.Exit(2)
    stopped = stop_fleet(settings)
    console.print(f"stopped {stopped} worker(s) in Ray namespace {settings.fleet_namespace!r}")


@app.command("admin-key")
def admin_key() -> None:
    """Print the admin key (generating it on first use)."""
    from infaas.api.auth import ensure_admin_key

    typer.echo(ensure_admin_key(load_settings()))


@app.command("profile")
def profile(
    architecture: str = typer.Argument(..., help="Architecture to (re-)profile."),
    variant: str | None = typer.Option(None, "--variant", help="Only this variant (e.g. onnx-cpu-int8-t1)."),
    force: bool = typer.Option(False, "--force", help="Re-measure even variants with a profile from here."),
    quick: bool = typer.Option(False, "--quick", help="Fewer, shorter windows: rough numbers, fast."),
) -> None:
    """Measure an architecture's variants on this machine, one worker process each, and print them."""
    from infaas.errors import InfaasError
    from infaas.store import open_store
    from profiler.process import ProcessProfiler
    from profiler.report import RichProgress, profile_table

    settings = load_settings()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # for TensorFlow in the workers, not read by infaas
    store = open_store(settings)
    try:
        with RichProgress(console) as bar:
            profiler = ProcessProfiler(settings, store, quick=quick, progress=bar)
            fresh, kept = profiler.profile_architecture(architecture, variant=variant, force=force)
        console.print(profile_table([*fresh, *kept], profiler.machine, title=f"profiles of {architecture}"))
        console.print(
            f"measured {len(fresh)} variant(s), kept {len(kept)} existing profile(s) from this machine"
            + ("" if force or not kept else " (--force re-measures them)")
        )
        failed = [p for p in fresh if p.status != "ok"]
        if failed:
            console.print(f"[red]{len(failed)} failed[/]; the reasons are in the table above")
            raise typer.Exit(1)
    except InfaasError as exc:
        console.print(f"[red]error:[/] {exc.message}")
        raise typer.Exit(1) from exc
    finally:
        store.close()


@app.command("register")
def register(
    path: Annotated[Path, typer.Argument(help="Model: .keras, .onnx, SavedModel dir/.zip/.tar.gz, .joblib.")],
    name: str = typer.Option(..., "--name", help="Architecture name, e.g. digits-cnn."),
    task: str = typer.Option(..., "--task", help="Task name; a new task needs --validation."),
    validation: Annotated[Path | None, typer.Option("--validation", help=".npz with arrays x and y.")] = None,
    description: str = typer.Option("", "--description"),
    no_profile: bool = typer.Option(False, "--no-profile", help="Register without measuring."),
    new_version: bool = typer.Option(
        False, "--new-version", help="Other bytes under an existing name become its next version."
    ),
) -> None:
    """Register a model (as the admin): build its variants, check parity, store them."""
    from infaas.errors import InfaasError
    from infaas.registry import build_registry
    from infaas.store import open_store
    from profiler.process import CallbackProgress, ProcessProfiler
    from variants.report import BuildProgress, skipped_table, variants_table

    settings = load_settings()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # for TensorFlow, not read by infaas
    store = open_store(settings)
    try:
        with BuildProgress(console, f"registering {name}") as bar:
            profiler = ProcessProfiler(settings, store, progress=CallbackProgress(bar))
            registry = build_registry(settings, store, profiler=profiler)
            result = registry.register(
                path,
                name=name,
                task=task,
                validation=validation,
                description=description,
                profile=not no_profile,
                progress=bar,
                new_version=new_version,
            )
        stored = result.architecture.name
        if not result.created:
            console.print(f"[yellow]{stored}[/] is already registered with these bytes; nothing to do")
        elif result.architecture.version > 1:
            console.print(
                f"version {result.architecture.version} of {name} is ready; it takes traffic once "
                f"labelled: `infaas canary {name} {result.architecture.version} --share 0.1` or "
                f"`infaas promote {name} --version {result.architecture.version}`"
            )
        from profiler.machine import local_machine

        profiles = {p.variant: p for p in store.list_profiles(stored, local_machine())}
        console.print(variants_table(result.variants, profiles, title=f"variants of {stored}"))
        if result.skipped:
            console.print(skipped_table(result.skipped))
        console.print(
            f"{len(result.variants)} variant(s) kept, {len(result.skipped)} not built"
            + (f"; task {task!r} created" if result.task_created else "")
            + f". Next: `infaas variants {stored}`"
        )
    except InfaasError as exc:
        console.print(f"[red]error:[/] {exc.message}")
        raise typer.Exit(1) from exc
    finally:
        store.close()


@app.command("models")
def models(task: str | None = typer.Option(None, "--task", help="Only this task's architectures.")) -> None:
    """List the registered architectures."""
    from infaas.store import open_store
    from variants.report import models_table

    store = open_store(load_settings())
    try:
        archs = store.list_architectures(task)
        counts = {a.name: (len(store.list_variants(a.name)), len(store.list_skipped(a.name))) for a in archs}
        console.print(models_table(archs, counts))
        if not archs:
            console.print("no architectures yet: `infaas zoo install` or `infaas register PATH ...`")
    finally:
        store.close()


@app.command("variants")
def variants(architecture: str = typer.Argument(..., help="Architecture name.")) -> None:
    """Show an architecture's variants (parity, profile) and the variants not built, with reasons."""
    from infaas.store import open_store
    from variants.report import skipped_table, variants_table

    store = open_store(load_settings())
    try:
        if store.get_architecture(architecture) is None:
            console.print(f"[red]error:[/] no architecture {architecture!r}; `infaas models` lists them")
            raise typer.Exit(1)
        from profiler.machine import local_machine

        profiles = {p.variant: p for p in store.list_profiles(architecture, local_machine())}
        console.print(
            variants_table(store.list_variants(architecture), profiles, f"variants of {architecture}")
        )
        skipped = store.list_skipped(architecture)
        if skipped:
            console.print(skipped_table(skipped))
    finally:
        store.close()


# ---- through the running server: the version lifecycle (it loads, switches and drains) and a
# tenant's default targets ------------------------------------------------------------------------
_URL = typer.Option(None, "--url", help="The server (default: http://INFAAS_HOST:INFAAS_PORT).")
_KEY = typer.Option(
    None, "--key", envvar="INFAAS_API_KEY", help="An owner or admin key (default: this data dir's admin key)."
)


def _lifecycle(url: str | None, key: str | None, call: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """Run one call against the server; errors print what to do and exit 1."""
    from infaas.api.auth import ensure_admin_key
    from infaas.client import Client
    from infaas.errors import InfaasError

    settings = load_settings()
    base = url or f"http://{settings.host}:{settings.port}"
    try:
        with Client(base, key or ensure_admin_key(settings), timeout_s=600.0) as client:
            return call(client)
    except InfaasError as exc:
        console.print(f"[red]error:[/] {exc.message}")
        raise typer.Exit(1) from exc


def _print_versions(view: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"versions of {view['architecture']} (task {view['task']})")
    for col in ("version", "name", "state", "labels", "accuracy", "variants", "loaded", "error"):
        table.add_column(col)
    for v in view["versions"]:
        acc = "-" if v["accuracy"] is None else f"{v['accuracy']:.4f}"
        table.add_row(
            str(v["version"]),
            v["name"],
            v["state"],
            ",".join(v["labels"]),
            acc,
            str(v["variants"]),
            str(len(v["loaded"])),
            v["error"] or "",
        )
    console.print(table)
    if view["canary"] is not None:
        seen = view["observed_canary_share"]
        console.print(
            f"canary v{view['canary']} at {view['canary_share']:.1%} of queries; observed "
            + ("nothing yet" if seen is None else f"{seen:.1%} of {view['observed_queries']}")
        )


@app.command("targets")
def targets(
    task: str | None = typer.Argument(None, help="Set this task's defaults (omit to list them)."),
    latency_ms: float | None = typer.Option(None, "--latency-ms", help="Latency target, ms."),
    min_accuracy: float = typer.Option(0.0, "--min-accuracy", help="Accuracy floor, 0-1."),
    max_cost: float | None = typer.Option(None, "--max-cost-usd-per-1k", help="Cost ceiling."),
    url: str | None = _URL,
    key: str | None = typer.Option(None, "--key", envvar="INFAAS_API_KEY", help="The tenant's key."),
) -> None:
    """A tenant's default targets per task: what its requests that carry none are held to (the
    KServe V2 and TensorFlow Serving protocols)."""
    from rich.table import Table

    if task is not None:
        if latency_ms is None:
            console.print("[red]error:[/] --latency-ms is needed to set a task's defaults")
            raise typer.Exit(2)
        _lifecycle(url, key, lambda c: c.set_targets(task, latency_ms, min_accuracy, max_cost))
    rows = _lifecycle(url, key, lambda c: {"targets": c.targets()})["targets"]
    table = Table(title="default targets")
    for col in ("task", "latency_ms", "min_accuracy", "max_cost_usd_per_1k"):
        table.add_column(col)
    for t in rows:
        table.add_row(
            t["task"], f"{t['latency_ms']:g}", f"{t['min_accuracy']:g}", str(t["max_cost_usd_per_1k"])
        )
    console.print(table)


@app.command("versions")
def versions(
    architecture: str = typer.Argument(..., help="Architecture name."),
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """Show an architecture's versions, their states and labels, and the canary share observed."""
    _print_versions(_lifecycle(url, key, lambda c: c.versions(architecture)))


@app.command("canary")
def canary(
    architecture: str = typer.Argument(..., help="Architecture name."),
    version: int | None = typer.Argument(None, help="The version that takes the share."),
    share: float = typer.Option(0.1, "--share", help="Fraction of the architecture's queries."),
    off: bool = typer.Option(False, "--off", help="End the canary."),
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """Send a share of an architecture's queries to a new version (loaded and warmed first)."""
    if off:
        _print_versions(_lifecycle(url, key, lambda c: c.end_canary(architecture)))
        return
    if version is None:
        console.print("[red]error:[/] name the version, e.g. `infaas canary ARCH 2 --share 0.1`")
        raise typer.Exit(2)
    _print_versions(_lifecycle(url, key, lambda c: c.set_canary(architecture, version, share)))


@app.command("promote")
def promote(
    architecture: str = typer.Argument(..., help="Architecture name."),
    version: int | None = typer.Option(None, "--version", help="Default: the canary."),
    force: bool = typer.Option(False, "--force", help="Admin only: past the accuracy guard."),
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """Make the canary (or --version) the stable version, without a gap in serving."""
    _print_versions(_lifecycle(url, key, lambda c: c.promote(architecture, version, force)))


@app.command("rollback")
def rollback(
    architecture: str = typer.Argument(..., help="Architecture name."),
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """Make the previous stable version stable again."""
    _print_versions(_lifecycle(url, key, lambda c: c.rollback(architecture)))


@app.command("delete")
def delete(
    architecture: str = typer.Argument(..., help="Architecture name."),
    version: int | None = typer.Option(None, "--version", help="Only this version."),
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """Delete a version or a whole architecture: unroutable at once, drained, unloaded, its
    artifacts removed; its usage stays."""
    done = _lifecycle(url, key, lambda c: c.delete(architecture, version))
    console.print(
        f"deleted {architecture} version(s) {done['versions']}: {done['variants']} variant(s), "
        f"{done['artifacts_removed']} artifact folder(s) removed; usage kept"
    )


job_app = typer.Typer(no_args_is_help=True, help="Offline batch jobs: a file of rows in, outputs out.")
app.add_typer(job_app, name="job")


def _job_line(job: dict[str, Any]) -> str:
    eta = "" if job["eta_s"] is None else f", ~{job['eta_s']:.0f} s left"
    return (
        f"job {job['id']}: {job['state']}, {job['rows_done']}/{job['rows']} rows, "
        f"${job['cost_usd']:.6g} so far{eta}" + (f" ({job['error']})" if job["error"] else "")
    )


def _watch(url: str | None, key: str | None, job: dict[str, Any]) -> dict[str, Any]:
    """Follow a job with a progress bar until it ends."""
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    job_id = job["id"]
    columns = (
        TextColumn("job {task.fields[id]}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} rows"),
    )
    with Progress(*columns, TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("job", total=job["rows"], id=job_id)
        while job["state"] in ("queued", "running"):
            time.sleep(0.5)
            job = _lifecycle(url, key, lambda c: c.job(job_id))
            bar.update(task, completed=job["rows_done"])
    return job


@job_app.command("submit")
def job_submit(
    path: Annotated[Path, typer.Argument(help="Rows: .npy, .npz, .csv or .jsonl.")],
    task: str | None = typer.Option(
        None, "--task", help="Model-less: the cheapest variant meeting the targets."
    ),
    architecture: str | None = typer.Option(None, "--architecture", help="Or an architecture (or version)."),
    min_accuracy: float = typer.Option(0.0, "--min-accuracy"),
    max_cost: float | None = typer.Option(None, "--max-cost-usd-per-1k"),
    wait: bool = typer.Option(False, "--wait", help="Follow it with a progress bar until it ends."),
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """Queue an offline job; it runs below online queries, on the cheapest variant meeting them."""
    job = _lifecycle(
        url,
        key,
        lambda c: c.submit_job(
            str(path),
            task=task,
            architecture=architecture,
            min_accuracy=min_accuracy,
            max_cost_usd_per_1k=max_cost,
        ),
    )
    console.print(_job_line(_watch(url, key, job) if wait else job))


@job_app.command("status")
def job_status(
    job_id: str = typer.Argument(..., help="The job's id."),
    watch: bool = typer.Option(False, "--watch", help="Follow it with a progress bar until it ends."),
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """A job's state, rows done, ETA and cost so far."""
    job = _lifecycle(url, key, lambda c: c.job(job_id))
    console.print(_job_line(_watch(url, key, job) if watch else job))


@job_app.command("fetch")
def job_fetch(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the outputs (.npy or .jsonl).")],
    url: str | None = _URL,
    key: str | None = _KEY,
) -> None:
    """Write a finished job's outputs, in input order."""
    fmt = "jsonl" if out.suffix == ".jsonl" else "npy"
    data = _lifecycle(url, key, lambda c: {"data": c.job_result(job_id, fmt)})["data"]
    out.write_bytes(data)
    console.print(f"wrote {out} ({len(data):,} bytes)")


@job_app.command("cancel")
def job_cancel(
    job_id: str = typer.Argument(..., help="The job's id."), url: str | None = _URL, key: str | None = _KEY
) -> None:
    """Cancel a job: no chunk starts after this; what ran is charged."""
    console.print(_job_line(_lifecycle(url, key, lambda c: c.cancel_job(job_id))))


zoo_app = typer.Typer(no_args_is_help=True, help="The built-in model zoo (trained here, no downloads).")
app.add_typer(zoo_app, name="zoo")


@zoo_app.command("install")
def zoo_install(
    if_missing: bool = typer.Option(False, "--if-missing", help="Skip architectures already registered."),
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Only these architectures (repeatable).")
    ] = None,
    no_profile: bool = typer.Option(False, "--no-profile", help="Register without measuring."),
) -> None:
    """Train the zoo's models and register them through the public registration path."""
    import time

    from infaas.errors import InfaasError
    from infaas.store import open_store
    from profiler.process import CallbackProgress, ProcessProfiler
    from variants import zoo
    from variants.report import BuildProgress, zoo_table

    settings = load_settings()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # for TensorFlow, not read by infaas
    store = open_store(settings)
    start = time.perf_counter()
    try:
        wanted = only or [m.name for m in zoo.ZOO]
        if if_missing and all(store.get_architecture(n) is not None for n in wanted):
            console.print(f"model zoo present ({len(wanted)} architectures); nothing to install")
            return
        with BuildProgress(console, "model zoo") as bar:
            # The bar counts architectures; profiling reports its variant inside the current one.
            arch_done = [0, len(wanted)]

            def on_zoo(message: str, done: int, total: int) -> None:
                arch_done[:] = [done, total]
                bar(message, done, total)

            def on_profile(message: str, _i: int, _n: int) -> None:
                bar(message, arch_done[0], arch_done[1])

            profiler = (
                None
                if no_profile
                else ProcessProfiler(settings, store, progress=CallbackProgress(on_profile))
            )
            results = zoo.install(
                settings, store, only=only, if_missing=if_missing, profiler=profiler, progress=on_zoo
            )
        console.print(zoo_table(results))
        installed = [r for r in results if r.result is not None]
        kept = sum(len(r.result.variants) for r in installed if r.result is not None)
        console.print(
            f"installed {len(installed)} architecture(s), {kept} variant(s) in "
            f"{time.perf_counter() - start:.0f} s. Next: `infaas models`, `infaas serve`"
        )
    except InfaasError as exc:
        console.print(f"[red]error:[/] {exc.message}")
        raise typer.Exit(1) from exc
    finally:
        store.close()


@app.command("simulate")
def simulate(
    trace: str = typer.Option(
        "bursty", "--trace", help="poisson, diurnal, bursty, or a recorded FILE.csv (time_s,tenant,task,…)."
    ),
    seconds: float = typer.Option(120.0, "--seconds", help="Virtual seconds of a generated trace."),
    rate: float = typer.Option(200.0, "--rate", help="Mean queries/s of a generated trace."),
    mode: str = typer.Option("all", "--mode", help="modelless, static, replicate-only, or all."),
    workers: int = typer.Option(4, "--workers", help="Simulated worker machines."),
    cores: int = typer.Option(8, "--cores", help="Cores per worker."),
    front_ends: int = typer.Option(1, "--front-ends", help="Front ends behind a load balancer."),
    gpu_workers: int = typer.Option(
        0, "--gpu-workers", min=0, help="Of the workers, how many have GPUs (the GPU machine class)."
    ),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs per GPU worker."),
    synthetic: str | None = typer.Option(
        None, "--synthetic", help="TASKSxVARIANTS (e.g. 10x100): a synthetic zoo instead of the store's."
    ),
    static_replicas: int | None = typer.Option(
        None, "--static-replicas", help="Replicas per variant in static mode (default: sized for the peak)."
    ),
    noise: float | None = typer.Option(
        None,
        "--noise",
        help="Log-normal sigma of a batch's run time around p50; unset: each profile's spread (p50 to p99).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the trace and the noise."),
    svg_path: Annotated[
        Path | None, typer.Option("--svg", help="Write replicas, p99 and fleet cost over time here.")
    ] = None,
    save_trace: Annotated[
        Path | None, typer.Option("--save-trace", help="Write the generated trace as CSV.")
    ] = None,
    per_tenant: bool = typer.Option(True, "--per-tenant/--totals", help="Rows per tenant under each mode."),
) -> None:
    """Replay a trace through the service's own policies in virtual time, per mode (no service runs)."""
    import numpy as np
    from rich.progress import Progress

    from infaas.sim import engine, report, traces
    from infaas.sim.zoo import from_store, mixed_tenants, synthetic_zoo

    modes = list(engine.MODES) if mode == "all" else [mode]
    if any(m not in engine.MODES for m in modes):
        console.print(f"[red]error:[/] --mode is one of {', '.join(engine.MODES)} or all")
        raise typer.Exit(2)
    if synthetic is not None:
        try:
            n_tasks, n_variants = (int(x) for x in synthetic.lower().split("x"))
        except ValueError as exc:
            console.print("[red]error:[/] --synthetic is TASKSxVARIANTS, e.g. 10x100")
            raise typer.Exit(2) from exc
        zoo = synthetic_zoo(n_tasks, n_variants, seed=seed, gpu=gpu_workers > 0)
        source = f"synthetic zoo: {n_tasks} task(s) × {n_variants} variants" + (
            " + 2 GPU variants per architecture" if gpu_workers else ""
        )
    else:
        settings = load_settings()
        zoo = from_store(str(settings.data_dir))
        source = f"the store under {settings.data_dir}: {len(zoo.variants)} profiled variant(s)"
        if not zoo.variants:
            console.print(f"[red]error:[/] no profiled variants in {settings.data_dir}; try --synthetic 2x20")
            raise typer.Exit(1)
    rng = np.random.default_rng(seed)
    if gpu_workers > workers:
        console.print("[red]error:[/] --gpu-workers counts some of --workers: at most --workers")
        raise typer.Exit(2)
    if trace in ("poisson", "diurnal", "bursty"):
        # The targets come from the CPU variants: what a tenant asks does not depend on the fleet.
        cpu_only = zoo.cpu_only()
        mix = mixed_tenants(cpu_only if cpu_only.variants else zoo)
        if trace == "poisson":
            the_trace = traces.poisson([(seconds, rate)], mix, rng)
        elif trace == "diurnal":
            the_trace = traces.diurnal(seconds, rate, mix, rng)
        else:
            the_trace = traces.bursty(seconds, rate, mix, rng)
    else:
        the_trace = traces.read_csv(Path(trace))
    if save_trace is not None:
        traces.write_csv(the_trace, save_trace)
    console.print(
        f"{source}; trace {trace}: {len(the_trace):,} queries over {the_trace.duration_s:.0f} s, "
        f"{len(the_trace.tenants)} tenant(s); {workers} worker(s) × {cores} cores"
        + (f", {gpu_workers} of them with {gpus} GPU(s)" if gpu_workers else "")
    )
    config = engine.SimConfig(
        workers=workers,
        cores=cores,
        front_ends=front_ends,
        gpu_workers=gpu_workers,
        gpus=gpus,
        noise=noise,
        seed=seed,
        static_replicas=static_replicas,
    )
    results = []
    with Progress(console=console, transient=True) as progress:
        for m in modes:
            bar = progress.add_task(m, total=1.0)

            def advance(done: float, bar: Any = bar) -> None:
                progress.update(bar, completed=done)

            results.append(engine.simulate(zoo, the_trace, m, config, progress=advance))  # type: ignore[arg-type]
    report.print_report(results, console, per_tenant)
    for r in results:
        console.print(
            f"{r.mode}: {r.wall_s:.1f} s wall "
            f"({len(the_trace) / max(r.wall_s, 1e-9):,.0f} queries/s simulated); "
            f"autoscaler actions {r.actions or 'none'}"
        )
    if svg_path is not None:
        report.svg(results, svg_path)
        console.print(f"plot: {svg_path}")


@app.command("query")
def query(
    task: str = typer.Argument(..., help="Task name (`GET /v1/tasks` lists them)."),
    key: str = typer.Option(..., "--key", help="Your tenant API key (from POST /v1/admin/tenants)."),
    latency_ms: float = typer.Option(..., "--latency-ms", help="End-to-end latency bound at the server."),
    min_accuracy: float = typer.Option(0.0, "--min-accuracy", help="Minimum validation accuracy, 0..1."),
    max_cost: float | None = typer.Option(None, "--max-cost-usd-per-1k", help="Cost cap per 1 000 rows."),
    inputs: str | None = typer.Option(
        None, "--inputs", help="Rows as JSON, or @file (.json or .npy). Default: --random-rows."
    ),
    random_rows: int = typer.Option(
        1, "--random-rows", min=1, help="Without --inputs: this many random rows."
    ),
    architecture: str | None = typer.Option(
        None, "--architecture", help="Pin a model; infaas picks its variant."
    ),
    variant: str | None = typer.Option(None, "--variant", help="Pin an exact variant."),
    url: str | None = typer.Option(
        None, "--url", help="Server URL (default: http://INFAAS_HOST:INFAAS_PORT)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the raw answer as JSON."),
) -> None:
    """Send one query and show which variant answered, how fast, and what it cost."""
    import numpy as np
    from rich.table import Table

    from infaas.client import Client
    from infaas.errors import InfaasError, NoFeasibleVariant

    settings = load_settings()
    server = url or f"http://{settings.host}:{settings.port}"
    with Client(server, key) as client:
        try:
            rows = _query_inputs(client.tasks, task, inputs, random_rows)
            result = client.query(
                task,
                rows,
                latency_ms=latency_ms,
                min_accuracy=min_accuracy,
                max_cost_usd_per_1k=max_cost,
                architecture=architecture,
                variant=variant,
            )
        except NoFeasibleVariant as exc:
            console.print(f"[red]no feasible variant:[/] {exc.message}")
            alternatives = exc.fields.get("alternatives") or {}
            table = Table("alternative", "variant", "accuracy", "predicted ms", "USD per 1k")
            for label, alt in alternatives.items():
                if alt:
                    table.add_row(
                        label.replace("_", " "),
                        alt["variant"],
                        f"{alt['accuracy']:.4f}",
                        f"{alt['predicted_latency_ms']:.3f}",
                        f"{alt['cost_usd_per_1k']:.3g}",
                    )
            if table.row_count:
                console.print(table)
                console.print("Next: relax --latency-ms or --min-accuracy to an alternative's numbers.")
            else:
                console.print(
                    "no variant reaches that accuracy, and none answers within that latency. "
                    "Next: lower --min-accuracy and raise --latency-ms, or register a better model."
                )
            raise typer.Exit(1) from exc
        except InfaasError as exc:
            console.print(f"[red]error:[/] {exc.message}")
            raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps({**result.__dict__, "outputs": result.outputs.tolist()}))
        return
    table = Table("variant", "accuracy", "predicted ms", "measured ms", "SLO met", "cost USD", "batch rows")
    table.add_row(
        result.variant,
        f"{result.accuracy:.4f}",
        f"{result.predicted_latency_ms:.3f}",
        f"{result.latency_ms:.3f}",
        "[green]yes[/]" if result.slo_met else "[red]no[/]",
        f"{result.cost_usd:.3e}",
        str(result.batch_rows),
    )
    console.print(table)
    console.print(f"predicted classes: {np.argmax(result.outputs, axis=1).tolist()}  ({result.reason})")
    if result.load_hint:
        console.print(f"cheaper variant being loaded for next time: {result.load_hint}")


def _query_inputs(
    list_tasks: Callable[[], list[dict[str, Any]]], task: str, inputs: str | None, random_rows: int
) -> list[object]:
    """Rows from --inputs (JSON or @file), else random rows of the task's input shape."""
    import numpy as np

    from infaas.errors import InvalidInput, TaskNotFound

    if inputs is not None:
        if inputs.startswith("@"):
            path = Path(inputs[1:])
            if path.suffix == ".npy":
                loaded: list[object] = np.load(path).tolist()
                return loaded
            text = path.read_text()
        else:
            text = inputs
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--inputs is not JSON ({exc}); pass rows like [[0.1, 0.2, ...]]") from exc
        if not isinstance(rows, list):
            raise InvalidInput("--inputs must be a JSON list of rows")
        return rows
    spec = next((t for t in list_tasks() if t["name"] == task), None)
    if spec is None:
        raise TaskNotFound(f"no task {task!r}; `infaas models` lists what is registered")
    rng = np.random.default_rng(0)
    random: list[object] = rng.random((random_rows, *spec["input_shape"])).tolist()
    return random


@app.command("usage")
def usage(
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant (the admin key sees all)."),
    since: str = typer.Option("1h", "--since", help="Window start: 15m, 1h, 7d, ISO 8601 or epoch seconds."),
    step: str | None = typer.Option(None, "--step", help="Bucket size (whole minutes); default automatic."),
    key: str | None = typer.Option(
        None, "--key", help="API key (default: the admin key in INFAAS_ADMIN_KEY or data_dir)."
    ),
    url: str | None = typer.Option(
        None, "--url", help="Server URL (default: http://INFAAS_HOST:INFAAS_PORT)."
    ),
) -> None:
    """Queries, cost, SLO attainment and p50/p99 per tenant, and cost by variant (as /dashboard)."""
    from infaas.errors import InfaasError
    from infaas.usage_table import fetch_usage_report, tenants_table, variants_table, window_line

    settings = load_settings()
    server = url or f"http://{settings.host}:{settings.port}"
    api_key = key or settings.admin_key
    if api_key is None and settings.admin_key_path.exists():
        api_key = settings.admin_key_path.read_text().strip()
    if not api_key:
        console.print(f"[red]error:[/] no key: pass --key, or run where {settings.admin_key_path} exists")
        raise typer.Exit(1)
    try:
        report, is_admin = fetch_usage_report(server, api_key, since=since, tenant=tenant, step=step)
    except InfaasError as exc:
        console.print(f"[red]error:[/] {exc.message}")
        raise typer.Exit(1) from exc
    who = "all tenants" if is_admin and tenant is None else ", ".join(t.tenant for t in report.tenants)
    console.print(f"[bold]{who}[/]: {window_line(report)}")
    console.print(tenants_table(report))
    if report.by_variant:
        console.print(variants_table(report))


def main() -> None:
    app()
