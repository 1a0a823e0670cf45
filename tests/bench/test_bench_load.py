"""bench.load's lost-token check: the harmony tokens the deltas carry equal usage.output_tokens,
and a lost delta shows."""

from __future__ import annotations

from bench.load import harmony_tokens
from tests.support.sdk_scenarios import WEATHER_TOOL, raw_stream


def test_deltas_rendered_back_are_the_output_tokens(inprocess_url):
    for body in (
        {"model": "gpt-oss-replay", "input": "Every token, ünïcödé 日本語 👍🏽, exactly once."},
        {"model": "gpt-oss-replay", "input": 'call get_weather {"city": "Paris"}', "tools": [WEATHER_TOOL]},
    ):
        events = raw_stream(inprocess_url, body)
        assert harmony_tokens(events) == events[-1]["response"]["usage"]["output_tokens"]
        deltas = [i for i, e in enumerate(events) if e["type"].endswith(".delta")]
        assert len(deltas) > 1
        without_one = events[: deltas[-1]] + events[deltas[-1] + 1 :]
        assert harmony_tokens(without_one) < events[-1]["response"]["usage"]["output_tokens"]
