"""What running a variant costs: price table × the resources it holds × time.

A CPU variant holds as many vCPUs as it has threads; a GPU variant holds one GPU. The price of
those resources per second times the time a batch takes, divided by the rows in the batch, is the
cost of one row. Pure arithmetic; the only I/O is `load_price_table`, which reads the optional
JSON file named by ``Settings.price_table``.

The default table is Google Cloud's on-demand list prices in us-central1: the N2 predefined vCPU
(memory is not charged: the models here hold less than a GiB) and the NVIDIA T4 GPU, as published
on cloud.google.com/compute/vm-instance-pricing and cloud.google.com/compute/gpus-pricing.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infaas.errors import InvalidInput
from infaas.types import PUSD_PER_USD, VariantSpec

__all__ = [
    "DEFAULT_PRICE_TABLE",
    "PriceTable",
    "cost_pusd_per_row",
    "cost_usd_per_1k",
    "load_price_table",
    "price_usd_per_s",
]

_S_PER_HOUR = 3600.0


class PriceTable(BaseModel):
    """Prices per resource-hour, and where they come from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    region: str
    as_of: str = Field(description="Date the prices were read from the source (YYYY-MM-DD).")
    source: str
    vcpu_hour_usd: float = Field(gt=0)
    gpu_hour_usd: float = Field(gt=0)
    gpu_model: str = "any"


DEFAULT_PRICE_TABLE = PriceTable(
    provider="Google Cloud Compute Engine (on-demand)",
    region="us-central1",
    as_of="2024-06-01",
    source=(
        "https://cloud.google.com/compute/vm-instance-pricing (N2 predefined vCPU); "
        "https://cloud.google.com/compute/gpus-pricing (NVIDIA T4)"
    ),
    vcpu_hour_usd=0.031611,
    gpu_hour_usd=0.35,
    gpu_model="NVIDIA T4",
)


def load_price_table(path: Path | None) -> PriceTable:
    """The table in the JSON file at `path` (the fields of `PriceTable`), or the default one."""
    if path is None:
        return DEFAULT_PRICE_TABLE
    try:
        raw = json.loads(path.read_text())
        return PriceTable.model_validate(raw)
    except OSError as exc:
        raise InvalidInput(
            f"cannot read the price table {path}: {exc.strerror}; fix INFAAS_PRICE_TABLE or unset it",
            path=str(path),
        ) from exc
    except (ValueError, ValidationError) as exc:
        raise InvalidInput(
            f"the price table {path} is not valid: {exc}. It is a JSON object with the fields "
            f"{', '.join(PriceTable.model_fields)}",
            path=str(path),
        ) from exc


def price_usd_per_s(spec: VariantSpec, table: PriceTable) -> float:
    """What the resources a variant holds cost per second: one GPU, or one vCPU per thread."""
    hourly = table.gpu_hour_usd if spec.hardware == "gpu" else table.vcpu_hour_usd * spec.cores
    return hourly / _S_PER_HOUR


def cost_usd_per_1k(price_per_s_usd: float, mean_ms: float, batch: int) -> float:
    """USD per 1 000 rows served in batches of `batch` rows taking `mean_ms` each.

    The same formula as `Profile.cost_usd_per_1k`, so the per-point figure stored in a profile and
    the one the router computes from the profile agree.
    """
    if batch < 1:
        raise ValueError("batch must be ≥ 1")
    return price_per_s_usd * (mean_ms / 1000.0) / batch * 1000.0


def cost_pusd_per_row(price_per_s_usd: float, mean_ms: float, batch: int) -> int:
    """Integer pico-dollars one row costs (for summing: see `infaas.types`)."""
    return round(cost_usd_per_1k(price_per_s_usd, mean_ms, batch) / 1000.0 * PUSD_PER_USD)
