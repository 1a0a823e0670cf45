"""bench/vs_vllm.py's summary of its rounds: the interval that says whether a comparison is resolved."""

import statistics

from hypothesis import given
from hypothesis import strategies as st

from bench.vs_vllm import median_interval, round_spread

ratios = st.lists(st.floats(min_value=0.5, max_value=1.5, allow_nan=False), min_size=1, max_size=30)


@given(ratios)
def test_the_interval_holds_the_median_and_stays_within_the_rounds(values):
    low, high = median_interval(values, resamples=500)
    assert min(values) <= low <= statistics.median(values) <= high <= max(values)


def test_consistent_rounds_resolve_and_noisy_ones_do_not():
    assert median_interval([1.04, 1.05, 1.03, 1.06, 1.05, 1.04, 1.05, 1.03])[0] > 1
    low, high = median_interval([1.09, 0.95, 1.02, 0.98, 1.05, 0.90, 1.07, 0.93])
    assert low < 1 < high


def test_round_spread_pairs_each_round_of_ours_with_the_same_round_of_vllm():
    ours = [{32: {"tokens_per_s": t, "ttft_p50_ms": f}} for t, f in ((110.0, 100.0), (100.0, 120.0), (120.0, 104.0))]
    vllm = [{32: {"tokens_per_s": t, "ttft_p50_ms": f}} for t, f in ((100.0, 100.0), (110.0, 100.0), (120.0, 100.0))]
    tokens, ttft = round_spread(ours, vllm, [32])
    assert tokens.startswith("tokens/s ratio @32 by round: 1.10 0.91 1.00; >= 1.00 in 2 of 3; median 1.00")
    assert ttft.startswith("TTFT ratio @32 by round: 1.00 1.20 1.04; <= 1.05 in 2 of 3; median 1.04")
