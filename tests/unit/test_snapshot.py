"""`infaas.snapshot`: which variant the warm-up loads and the warm floor keeps."""

from __future__ import annotations

from infaas.sim.zoo import synthetic_zoo
from infaas.snapshot import cheapest_variants


def test_the_floor_is_the_cheapest_per_query_and_on_a_cpu_where_there_is_one() -> None:
    zoo = synthetic_zoo(4, 20, seed=0, gpu=True)
    catalog = dict(zoo.variants.items())
    floors = cheapest_variants(catalog, set(zoo.tasks))
    assert set(floors) == set(zoo.tasks)
    for arch, name in floors.items():
        mine = {n: p for n, (v, p) in catalog.items() if v.architecture == arch}
        cpu = {n: p for n, p in mine.items() if catalog[n][0].spec.hardware == "cpu"}
        assert name == min(cpu, key=lambda n: (cpu[n].cost_usd_per_1k(1), n))
    # The GPU variant is the cheaper per query for some architecture here: the rule mattered.
    assert any(
        min(
            p.cost_usd_per_1k(1)
            for n, (v, p) in catalog.items()
            if v.architecture == arch and v.spec.hardware == "gpu"
        )
        < catalog[floors[arch]][1].cost_usd_per_1k(1)
        for arch in floors
    )
    only_gpu = {n: vp for n, vp in catalog.items() if vp[0].spec.hardware == "gpu"}
    assert all(
        catalog[n][0].spec.hardware == "gpu" for n in cheapest_variants(only_gpu, set(zoo.tasks)).values()
    )
