"""bench/file_search.py runs both indexes side by side (a small store), and what it prints is
what it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.file_search import INDEXES, RANKINGS, report, run
from tests.support.postgres_server import postgres


@pytest.mark.slow
def test_the_bench_measures_both_indexes_on_the_same_work(tmp_path: Path) -> None:
    with postgres() as url:
        results = run(chunks=300, queries=20, dimensions=64, pg_url=url, directory=tmp_path, documents=60)
    assert (results["questions"], results["documents"]) == (120, 60)
    for index in INDEXES:
        assert set(results["recall_at_5"][index]) == set(RANKINGS)
        assert results["recall_at_5"][index]["hybrid"] > 0.5
        figures = results[index]
        assert figures["chunks"] == 300
        assert figures["ingest_chunks_per_s"] > 0
        assert 0 < figures["search_ms_p50"] <= figures["search_ms_p99"]
    *table, line = report(results)
    values = dict(item.split("=") for item in line.split())
    assert float(values["pgvector_search_ms_p50"]) == pytest.approx(results["pgvector"]["search_ms_p50"], abs=0.01)
    assert float(values["embedded_recall_hybrid"]) == pytest.approx(results["recall_at_5"]["embedded"]["hybrid"], abs=0.001)
    ratio = results["pgvector"]["search_ms_p50"] / results["embedded"]["search_ms_p50"]
    assert any(line.startswith("p50 ms") and line.split()[-1] == f"{ratio:.2f}" for line in table)
