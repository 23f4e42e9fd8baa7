"""The `infaas` command. Each command builds `Settings` once and passes it down."""

from __future__ import annotations

import json
import os

import typer
from rich.console import Console

from infaas.settings import Settings

__all__ = ["app", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=False, help="infaas: model-less inference.")
console = Console()


def load_settings() -> Settings:
    return Settings()


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Bind address (default: INFAAS_HOST or 127.0.0.1)."),
    port: int | None = typer.Option(None, help="Port (default: INFAAS_PORT or 8000)."),
) -> None:
    """Run the service in the foreground."""
    import uvicorn

    from infaas.api import create_app

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # for TensorFlow, not read by infaas
    application = create_app(settings)
    url = f"http://{settings.host}:{settings.port}"
    console.print(f"[bold green]infaas[/] serving on [bold]{url}[/]  (data: {settings.data_dir})")
    console.print(f"admin key: [bold]{application.state.admin_key}[/]  (also in {settings.admin_key_path})")
    example = {"task": "digits-classification", "inputs": [[0.0] * 64], "latency_ms": 20, "min_accuracy": 0.9}
    console.print("create a tenant, then query:")
    console.print(
        f"  curl -s -X POST {url}/v1/admin/tenants -H 'Authorization: Bearer {application.state.admin_key}' "
        "-H 'Content-Type: application/json' -d '{\"name\": \"demo\"}'"
    )
    console.print(
        f"  curl -s -X POST {url}/v1/query -H 'Authorization: Bearer <tenant key>' "
        f"-H 'Content-Type: application/json' -d '{json.dumps(example)}'"
    )
    uvicorn.run(application, host=settings.host, port=settings.port, log_level="warning")


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
        with RichProgress(console, total=0) as bar:
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


def main() -> None:
    app()
