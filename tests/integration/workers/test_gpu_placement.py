"""GPU workers placed by declared resources (issue 35), below the hardware line: a Ray node on
this CPU-only machine declares one GPU. The pool's GPU group may have as many workers as their
share of a GPU fits (`INFAAS_GPU_PER_WORKER`), not as many as the cluster has CPUs, and Ray
schedules each of them; nothing here runs on a GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infaas.settings import Settings
from infaas.workers.ray_pool import RayPool

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def one_gpu_cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 1, "include_dashboard": False}
    )
    try:
        yield cluster
    finally:
        cluster.shutdown()


def test_workers_share_a_declared_gpu_by_their_share(one_gpu_cluster: Any, tmp_path: Path) -> None:
    import ray

    settings = Settings(data_dir=tmp_path, ray_address=one_gpu_cluster.address, gpu_per_worker=0.5)
    pool = RayPool(settings, artifacts_dir=tmp_path)
    try:
        # Two GPU workers fit the one GPU at half a GPU each; the CPU groups count the 4 CPUs.
        assert pool._cap("onnxruntime-gpu") == 2 and pool._cap("onnxruntime") == 4
        workers = [pool._spawn("onnxruntime-gpu", "onnxruntime") for _ in range(2)]
        described = ray.get([w.handle.describe.remote() for w in workers], timeout=120)
        assert [d["group"] for d in described] == ["onnxruntime-gpu", "onnxruntime-gpu"]
        assert ray.available_resources().get("GPU", 0.0) == pytest.approx(0.0)  # both scheduled
        # Each hosts a variant now: the group is full, so a third variant shares one of them
        # (counted in CPUs, the cap was 4: a third worker would have waited for a GPU, and the
        # load for its 60 s timeout, for a 503).
        for n, worker in enumerate(workers):
            worker.loaded[f"arch/v{n}"] = 10.0
        third = pool._choose_worker("onnxruntime-gpu", "onnxruntime", "arch/v2", set())
        assert third is not None and third.worker_id in {w.worker_id for w in workers}
        assert len(pool._group("onnxruntime-gpu")) == 2
    finally:
        asyncio.run(pool.close())
