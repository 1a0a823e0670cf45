"""How long the event loop stalls: a probe that sleeps a short interval over and over and
records by how much each wake-up came late. A late wake-up is a pause of the whole loop (a
render, a parse, a garbage collection holding it): every stream on the replica waited that
long. Started on demand (a benchmark asks the ingress replica for it: `ResponsesIngress.loop_lag`);
it costs one timer every `interval_s`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class LoopLagReading:
    longest_pause_ms: float  # the latest wake-up since the last reading, over the interval
    pauses_over_50ms: int
    wakeups: int


class LoopLagProbe:
    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self._longest_s, self._over_50ms, self._wakeups = 0.0, 0, 0

    def start(self) -> None:
        """Probe the running loop from now on (idempotent)."""
        if self._task is None or self._task.done():
            self._reset()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop lag probe")

    def take(self) -> LoopLagReading:
        """What it saw since the last reading (or its start); counted afresh from now."""
        reading = LoopLagReading(self._longest_s * 1e3, self._over_50ms, self._wakeups)
        self._reset()
        return reading

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.interval_s)
            late = loop.time() - before - self.interval_s
            self._wakeups += 1
            self._longest_s = max(self._longest_s, late)
            self._over_50ms += late > 0.05
