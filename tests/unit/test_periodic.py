from __future__ import annotations

import asyncio

from infaas.periodic import Periodic


def test_rounds_run_until_closed_and_a_failing_round_does_not_stop_the_loop() -> None:
    calls: list[int] = []

    async def round_fn() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("first round fails")

    async def scenario() -> None:
        loop = Periodic("test", 0.001, round_fn)
        loop.start()
        assert loop.running
        while len(calls) < 3:
            await asyncio.sleep(0.001)
        await loop.close()
        assert not loop.running
        seen = len(calls)
        await asyncio.sleep(0.01)
        assert len(calls) == seen  # nothing runs after close

    asyncio.run(scenario())
