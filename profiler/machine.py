"""The machine a profile is measured on, and whether a stored profile comes from another one.

A profile measured on a 64-core server says nothing about latency on a 2-core laptop, so profiles
carry the machine's fingerprint (CPU model, usable cores, GPU) and profiles whose fingerprint
differs from the local one are reported as foreign instead of being mixed in silently.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from infaas.types import MachineInfo, Profile

__all__ = ["cpu_model_from_cpuinfo", "is_foreign", "local_machine", "split_by_machine"]

_CPUINFO = Path("/proc/cpuinfo")


def cpu_model_from_cpuinfo(text: str) -> str | None:
    """The first ``model name`` in /proc/cpuinfo's text (x86), or its ``Hardware``/``Model`` (ARM)."""
    for key in ("model name", "Hardware", "Model"):
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return None


def _usable_cores() -> int:
    # Affinity, not os.cpu_count(): a container limited to 2 of 64 cores measures like 2 cores.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _gpu_name() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


@functools.cache
def local_machine() -> MachineInfo:
    """This machine's fingerprint: CPU model, cores usable by this process, first GPU if any
    (probed once per process: nvidia-smi takes tens of milliseconds)."""
    model: str | None = None
    try:
        model = cpu_model_from_cpuinfo(_CPUINFO.read_text())
    except OSError:
        model = None
    return MachineInfo(
        cpu_model=model or platform.processor() or platform.machine() or "unknown",
        cores=_usable_cores(),
        gpu=_gpu_name(),
    )


def is_foreign(profile: Profile, local: MachineInfo) -> bool:
    """True when `profile` was measured on a machine with another fingerprint."""
    return profile.machine.fingerprint != local.fingerprint


def split_by_machine(profiles: Iterable[Profile], local: MachineInfo) -> tuple[list[Profile], list[Profile]]:
    """(profiles measured here, profiles from other machines)."""
    here: list[Profile] = []
    foreign: list[Profile] = []
    for profile in profiles:
        (foreign if is_foreign(profile, local) else here).append(profile)
    return here, foreign
