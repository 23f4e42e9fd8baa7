"""The Ray pool's pure parts: how many workers each group may have."""

from __future__ import annotations

from infaas.workers.ray_pool import workers_cap


def test_a_cpu_group_gets_a_worker_per_cpu_unless_set() -> None:
    assert workers_cap(False, cpus=8, gpus=1, gpu_share=1.0, configured=None) == 8
    assert workers_cap(False, cpus=0.5, gpus=0, gpu_share=1.0, configured=None) == 1
    assert workers_cap(False, cpus=8, gpus=0, gpu_share=1.0, configured=3) == 3


def test_a_gpu_group_counts_gpus_by_each_workers_share() -> None:
    # One GPU on a 16-CPU node: one worker holding it whole (not 16 that cannot be scheduled).
    assert workers_cap(True, cpus=16, gpus=1, gpu_share=1.0, configured=None) == 1
    # Fractional: four workers share it, so four variants' workers run side by side on it.
    assert workers_cap(True, cpus=16, gpus=1, gpu_share=0.25, configured=None) == 4
    assert workers_cap(True, cpus=16, gpus=2, gpu_share=0.3, configured=None) == 6
    assert workers_cap(True, cpus=16, gpus=1, gpu_share=0.25, configured=2) == 2
    assert workers_cap(True, cpus=16, gpus=0, gpu_share=1.0, configured=None) == 0  # nowhere to go
