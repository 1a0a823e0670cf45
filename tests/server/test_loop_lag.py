"""The loop-lag probe (serve_app/runtime/loop_lag.py) that `bench.overload --hostile` reads from
the ingress replica: it wakes up, counts, and starts afresh at each reading. What it measures
is time, so it is reported by the benchmark, never asserted here."""

from __future__ import annotations

import asyncio

from serve_app.runtime.loop_lag import LoopLagProbe


def test_the_probe_counts_its_wakeups_and_starts_afresh_at_each_reading():
    async def run() -> None:
        probe = LoopLagProbe(interval_s=0.001)
        probe.start()
        probe.start()  # idempotent: one probe
        while probe.take().wakeups == 0:
            await asyncio.sleep(0.01)
        assert probe.take().wakeups == 0  # nothing between two readings: counted afresh
        probe.stop()
        assert probe._task is None

    asyncio.run(run())
