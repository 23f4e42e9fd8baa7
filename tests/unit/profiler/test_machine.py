"""profiler.machine: fingerprints, and profiles from other machines are flagged."""

from __future__ import annotations

from infaas.types import MachineInfo, Profile
from profiler.machine import cpu_model_from_cpuinfo, is_foreign, local_machine, split_by_machine
from profiler.process import needs_profile

HERE = MachineInfo(cpu_model="AMD EPYC", cores=2)
THERE = MachineInfo(cpu_model="Intel Xeon Platinum 8480", cores=64, gpu="NVIDIA H100")


def _profile(name: str, machine: MachineInfo, status: str = "ok") -> Profile:
    return Profile.model_validate(
        {"variant": name, "machine": machine.model_dump(), "measured_at_s": 1.0, "status": status}
    )


def test_cpu_model_from_cpuinfo() -> None:
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n"
    assert cpu_model_from_cpuinfo(text) == "AMD EPYC 7B13"
    assert cpu_model_from_cpuinfo("Hardware\t: BCM2835\n") == "BCM2835"
    assert cpu_model_from_cpuinfo("nothing here") is None


def test_local_machine_has_a_model_and_cores() -> None:
    m = local_machine()
    assert m.cores >= 1 and m.cpu_model


def test_profile_from_another_machine_is_flagged() -> None:
    assert not is_foreign(_profile("a/x", HERE), HERE)
    assert is_foreign(_profile("a/y", THERE), HERE)
    assert is_foreign(_profile("a/z", HERE.model_copy(update={"cores": 4})), HERE)


def test_split_keeps_foreign_profiles_apart() -> None:
    here, foreign = split_by_machine([_profile("a/x", HERE), _profile("a/y", THERE)], HERE)
    assert [p.variant for p in here] == ["a/x"]
    assert [p.variant for p in foreign] == ["a/y"]


def test_foreign_failed_or_missing_profiles_are_measured_again() -> None:
    assert needs_profile(None, HERE, force=False)
    assert needs_profile(_profile("a/y", THERE), HERE, force=False)
    assert needs_profile(_profile("a/x", HERE, status="failed"), HERE, force=False)
    assert not needs_profile(_profile("a/x", HERE), HERE, force=False)
    assert needs_profile(_profile("a/x", HERE), HERE, force=True)
