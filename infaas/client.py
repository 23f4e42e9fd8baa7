"""The Python client: ``infaas.Client(url, api_key).query(task, inputs, latency_ms=..., ...)``.

Server errors come back as the same `infaas.errors` classes the server raised (matched by their
``error`` code), with the body's structured fields in ``err.fields`` (e.g. the alternatives of a
`NoFeasibleVariant`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx
import numpy as np

from infaas import errors

__all__ = ["Client", "QueryResult"]


def _error_classes() -> dict[str, type[errors.InfaasError]]:
    found: dict[str, type[errors.InfaasError]] = {}
    pending: list[type[errors.InfaasError]] = [errors.InfaasError]
    while pending:
        cls = pending.pop()
        found[cls.code] = cls
        pending.extend(cls.__subclasses__())
    return found


_BY_CODE = _error_classes()


@dataclass(frozen=True)
class QueryResult:
    """One answer, with the decision that produced it."""

    outputs: np.ndarray  # rows × classes
    variant: str
    architecture: str
    accuracy: float
    predicted_latency_ms: float
    latency_ms: float  # measured at the server, from receipt to reply
    cost_usd: float
    cost_pusd: int
    slo_met: bool
    batch_rows: int
    reason: str
    load_hint: str | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> QueryResult:
        return cls(
            outputs=np.asarray(body["outputs"], dtype=np.float32),
            variant=body["variant"],
            architecture=body["architecture"],
            accuracy=float(body["accuracy"]),
            predicted_latency_ms=float(body["predicted_latency_ms"]),
            latency_ms=float(body["latency_ms"]),
            cost_usd=float(body["cost_usd"]),
            cost_pusd=int(body["cost_pusd"]),
            slo_met=bool(body["slo_met"]),
            batch_rows=int(body["batch_rows"]),
            reason=str(body["reason"]),
            load_hint=body.get("load_hint"),
        )


class Client:
    """A synchronous client for one infaas server and one API key."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`transport` replaces the network (tests: `httpx.MockTransport`)."""
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def query(
        self,
        task: str,
        inputs: np.ndarray | Sequence[Any],
        *,
        latency_ms: float,
        min_accuracy: float = 0.0,
        max_cost_usd_per_1k: float | None = None,
        architecture: str | None = None,
        variant: str | None = None,
    ) -> QueryResult:
        """Answer `inputs` (rows of the task's input shape) within `latency_ms` at `min_accuracy`;
        pin an `architecture` (infaas picks its variant) or an exact `variant` if you must."""
        rows = inputs.tolist() if isinstance(inputs, np.ndarray) else list(inputs)
        body = {
            "task": task,
            "inputs": rows,
            "latency_ms": latency_ms,
            "min_accuracy": min_accuracy,
            "max_cost_usd_per_1k": max_cost_usd_per_1k,
            "architecture": architecture,
            "variant": variant,
        }
        return QueryResult.from_json(self._request("POST", "/v1/query", json=body))

    def usage(self, **params: str) -> dict[str, Any]:
        """This key's own usage (``GET /v1/usage``; params such as ``from_="1h"`` pass through)."""
        query = {k.rstrip("_"): v for k, v in params.items()}
        result: dict[str, Any] = self._request("GET", "/v1/usage", params=query)
        return result

    def tasks(self) -> list[dict[str, Any]]:
        """The tasks the server knows, with their input shape and architectures."""
        result: list[dict[str, Any]] = self._request("GET", "/v1/tasks")
        return result

    def set_targets(
        self,
        task: str,
        latency_ms: float,
        min_accuracy: float = 0.0,
        max_cost_usd_per_1k: float | None = None,
    ) -> dict[str, Any]:
        """Store this key's default targets for `task` (for requests that carry none)."""
        body = {
            "latency_ms": latency_ms,
            "min_accuracy": min_accuracy,
            "max_cost_usd_per_1k": max_cost_usd_per_1k,
        }
        result: dict[str, Any] = self._request("PUT", f"/v1/targets/{task}", json=body)
        return result

    def targets(self) -> list[dict[str, Any]]:
        """This key's default targets, per task."""
        result: list[dict[str, Any]] = self._request("GET", "/v1/targets")
        return result

    # ---- offline jobs ----------------------------------------------------------------------
    def submit_job(
        self,
        path: str,
        *,
        task: str | None = None,
        architecture: str | None = None,
        min_accuracy: float = 0.0,
        max_cost_usd_per_1k: float | None = None,
    ) -> dict[str, Any]:
        """Queue the rows in `path` (.npy, .npz, .csv, .jsonl) as an offline job."""
        form: dict[str, str] = {"min_accuracy": str(min_accuracy)}
        if task is not None:
            form["task"] = task
        if architecture is not None:
            form["architecture"] = architecture
        if max_cost_usd_per_1k is not None:
            form["max_cost_usd_per_1k"] = str(max_cost_usd_per_1k)
        with open(path, "rb") as fh:
            files = {"rows": (path.rsplit("/", 1)[-1], fh.read())}
        result: dict[str, Any] = self._request("POST", "/v1/jobs", files=files, data=form)
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's state, rows done, ETA and cost so far."""
        result: dict[str, Any] = self._request("GET", f"/v1/jobs/{job_id}")
        return result

    def job_result(self, job_id: str, fmt: str = "npy") -> bytes:
        """A finished job's outputs as the bytes of an .npy file or of JSON lines."""
        try:
            response = self._http.get(f"/v1/jobs/{job_id}/result", params={"format": fmt})
        except httpx.HTTPError as exc:
            raise errors.Unavailable(f"cannot reach infaas at {self.url}: {exc}") from exc
        if response.is_success:
            return response.content
        self._raise(response, f"/v1/jobs/{job_id}/result")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("DELETE", f"/v1/jobs/{job_id}")
        return result

    # ---- the version lifecycle (owner or admin keys; `versions` with any key) ----------------
    def versions(self, architecture: str) -> dict[str, Any]:
        """The architecture's versions, labels and the canary share observed."""
        result: dict[str, Any] = self._request("GET", f"/v1/models/{architecture}/versions")
        return result

    def set_canary(self, architecture: str, version: int, share: float) -> dict[str, Any]:
        """Send `share` of the architecture's queries to `version` (warmed first)."""
        body = {"version": version, "share": share}
        result: dict[str, Any] = self._request("PUT", f"/v1/models/{architecture}/canary", json=body)
        return result

    def end_canary(self, architecture: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("DELETE", f"/v1/models/{architecture}/canary")
        return result

    def promote(self, architecture: str, version: int | None = None, force: bool = False) -> dict[str, Any]:
        """Make the canary (or `version`) stable."""
        body = {"version": version, "force": force}
        result: dict[str, Any] = self._request("POST", f"/v1/models/{architecture}/promote", json=body)
        return result

    def rollback(self, architecture: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", f"/v1/models/{architecture}/rollback")
        return result

    def delete(self, architecture: str, version: int | None = None) -> dict[str, Any]:
        """Delete one version, or (no `version`) the whole architecture."""
        path = f"/v1/models/{architecture}" + (f"/versions/{version}" if version is not None else "")
        result: dict[str, Any] = self._request("DELETE", path)
        return result

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise errors.Unavailable(
                f"cannot reach infaas at {self.url}: {exc}; is `infaas serve` running there?"
            ) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success and body is not None:
            return body
        self._raise(response, path)

    def _raise(self, response: httpx.Response, path: str) -> NoReturn:
        """Raise the error an unsuccessful response carries, as its class in the error tree."""
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "error" in body:
            fields = {k: v for k, v in body.items() if k not in ("error", "detail")}
            cls = _BY_CODE.get(str(body["error"]), errors.InfaasError)
            raise cls(str(body.get("detail", "")), status=response.status_code, **fields)
        raise errors.InfaasError(
            f"HTTP {response.status_code} from {self.url}{path}: {response.text[:200]}",
            status=response.status_code,
        )
