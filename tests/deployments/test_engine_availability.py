"""EngineAvailability's polling schedule (deployments/ingress.py): Serve's status is read
often while a model is unavailable and rarely once all are up (it is expensive to read).
What the status says about a failed engine is shown end to end in tests/multinode."""

import asyncio

from deployments.ingress import EngineAvailability
from serve_app.runtime.turn import Unavailable


class ScriptedAvailability(EngineAvailability):
    """The real class with its one Serve call replaced by a scripted list of verdicts."""

    def __init__(self, verdicts: list[dict[str, str]]) -> None:
        super().__init__({"a": "EngineServer-a", "b": "EngineServer-b"}, period_s=2.0, settled_period_s=30.0)
        self._verdicts = verdicts
        self.reads = 0

    async def _refresh(self) -> None:
        self.reads += 1
        self._reasons = self._verdicts.pop(0) if self._verdicts else {}
        self._checked_at = asyncio.get_running_loop().time() or 1.0


def test_polls_soon_while_a_model_is_unavailable_and_rarely_once_all_are_up():
    async def scenario() -> list[tuple[str | None, float]]:
        availability = ScriptedAvailability([{"a": "DEPLOY_FAILED"}, {"a": "UPDATING"}, {}])
        seen = []
        for _ in range(3):
            await availability._refresh()
            seen.append((availability._reasons.get("a"), availability.next_poll_in()))
        return seen

    assert asyncio.run(scenario()) == [("DEPLOY_FAILED", 2.0), ("UPDATING", 2.0), (None, 30.0)]


def test_a_refusal_is_rechecked_and_an_available_model_costs_no_read():
    async def scenario() -> tuple[list[Unavailable | None], int]:
        availability = ScriptedAvailability([{"a": "UPDATING"}, {}])
        first = await availability.unavailable("a")  # no view yet: read once
        availability._checked_at = 0.5  # the refusal is stale: read again before refusing
        second = await availability.unavailable("a")
        reads = availability.reads
        third = await availability.unavailable("b")  # available on a fresh view: no read
        availability._poller.cancel()
        return [first, second, third], availability.reads - reads

    verdicts, extra_reads = asyncio.run(scenario())
    assert verdicts == [Unavailable("loading", "UPDATING"), None, None]
    assert extra_reads == 0
