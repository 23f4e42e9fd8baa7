"""The host's idle cores, measured only over windows in which replicas were busy."""

from __future__ import annotations

import os
import time

import pytest

from infaas.hostcpu import MeasuredHostCpu


class Counter:
    """Cumulative idle CPU seconds that the test advances."""

    def __init__(self) -> None:
        self.idle_s = 0.0

    def __call__(self) -> float:
        return self.idle_s


def test_idle_cores_come_from_busy_windows_only() -> None:
    counter = Counter()
    cpu = MeasuredHostCpu(window_s=0.25, idle_s=counter)
    assert cpu.idle_cores() == float(os.cpu_count() or 1)  # nothing measured: all of them
    cpu.sample(10.0, busy=True)
    counter.idle_s += 0.05  # 0.2 of a core idle over the next 0.25 s
    cpu.sample(10.1, busy=True)  # inside the window: not read
    cpu.sample(10.25, busy=True)
    assert cpu.idle_cores() == pytest.approx(0.2)
    # A quiet spell (nothing busy) is not measured: the cores it leaves idle say nothing about
    # what is left beside the work that runs once a burst comes.
    cpu.sample(10.3, busy=False)
    counter.idle_s += 2.0
    cpu.sample(11.3, busy=True)  # a new window starts here
    assert cpu.idle_cores() == pytest.approx(0.2)
    counter.idle_s += 0.25
    cpu.sample(11.55, busy=True)
    assert cpu.idle_cores() == pytest.approx(1.0)


def test_a_window_that_may_hide_a_quiet_spell_is_dropped() -> None:
    counter = Counter()
    cpu = MeasuredHostCpu(window_s=0.25, idle_s=counter)
    cpu.sample(10.0, busy=True)
    counter.idle_s += 0.1
    cpu.sample(10.25, busy=True)
    assert cpu.idle_cores() == pytest.approx(0.4)
    counter.idle_s += 3.0  # no query for 1.5 s: busy at both ends, maybe idle in between
    cpu.sample(11.75, busy=True)
    assert cpu.idle_cores() == pytest.approx(0.4)
    counter.idle_s += 0.0  # then a window with no idle time at all
    cpu.sample(12.0, busy=True)
    assert cpu.idle_cores() == 0.0


def test_the_real_counter_reads_this_host() -> None:
    cpu = MeasuredHostCpu(window_s=0.05)
    cpu.sample(0.0, busy=True)
    time.sleep(0.1)
    cpu.sample(0.1, busy=True)
    assert 0.0 <= cpu.idle_cores() <= (os.cpu_count() or 1) * 1.5
