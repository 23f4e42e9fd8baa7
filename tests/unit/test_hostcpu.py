"""The cores the front end leaves to replicas: the host's, less its own measured CPU use."""

from __future__ import annotations

import os
import time

import pytest

from infaas.hostcpu import FRONT_END_FLOOR_CORES, MeasuredHostCpu


class Counter:
    """Cumulative CPU seconds of the front end, advanced by the test."""

    def __init__(self) -> None:
        self.cpu_s = 0.0

    def __call__(self) -> float:
        return self.cpu_s


def test_spare_cores_are_the_hosts_less_the_front_ends_use_over_the_last_window() -> None:
    counter = Counter()
    cpu = MeasuredHostCpu(window_s=0.25, cpu_s=counter, cores=2.0)
    cpu.sample(10.0)
    assert cpu.spare_cores() == pytest.approx(2.0 - FRONT_END_FLOOR_CORES)  # nothing measured yet
    counter.cpu_s += 0.15  # 0.6 of a core over the next 0.25 s
    cpu.sample(10.1)  # inside the window: not read
    cpu.sample(10.25)
    assert cpu.spare_cores() == pytest.approx(1.4)
    counter.cpu_s += 0.01  # a quiet spell: measured ~0, counted at the floor
    cpu.sample(11.25)
    assert cpu.spare_cores() == pytest.approx(2.0 - FRONT_END_FLOOR_CORES)


def test_the_real_counters_read_this_process_and_host() -> None:
    cpu = MeasuredHostCpu(window_s=0.05)
    cpu.sample(time.monotonic())
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # busy: this process uses about a core
        pass
    cpu.sample(time.monotonic())
    cores = len(os.sched_getaffinity(0))
    assert cores - 1.5 <= cpu.spare_cores() <= cores - 0.5
