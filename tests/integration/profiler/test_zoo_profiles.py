"""Every variant of the small zoo, registered through the public path, has a complete profile
measured on this machine (TensorFlow, ONNX Runtime fp32 and int8, scikit-learn)."""

from __future__ import annotations

import pytest

from infaas.settings import Settings
from infaas.store import open_store
from profiler.machine import is_foreign, local_machine

pytestmark = pytest.mark.slow


def test_small_zoo_variants_all_have_complete_local_profiles(small_zoo: Settings) -> None:
    store = open_store(small_zoo)
    try:
        variants = store.list_variants()
        profiles = {p.variant: p for p in store.list_profiles()}
        tasks = {t.name: t for t in store.list_tasks()}
        archs = {a.name: a for a in store.list_architectures()}
    finally:
        store.close()
    assert {v.spec.runtime for v in variants} >= {"tensorflow", "onnxruntime", "sklearn"}
    here = local_machine()
    for v in variants:
        p = profiles.get(v.name)
        assert p is not None, f"{v.name} has no profile"
        assert p.status == "ok", f"{v.name}: {p.error}"
        assert not is_foreign(p, here)
        assert [pt.batch for pt in p.points] == [b for b in (1, 8, 32, 128) if b <= v.spec.max_batch]
        assert all(pt.p50_ms > 0 and pt.cost_usd_per_1k > 0 for pt in p.points)
        assert p.load_time_s > 0 and p.price_usd_per_s > 0
        # A classifier that registered with parity does better than chance on its own task.
        task = tasks[archs[v.architecture].task]
        assert p.accuracy > 1.5 / task.num_classes
