"""The Grafana dashboard: the committed JSON is what the code generates, and every query names
a metric this app defines or one of Ray Serve's (the e2e metrics test checks those names
against the real scrape)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from deployments.metrics import METRICS
from tests.support.grafana import PATH, load_dashboard

dashboard = load_dashboard()

# Exported series of a family: histograms add _bucket/_sum/_count, counters _total.
_SERIES = re.compile(r"\b(ray_\w+?)(?:_bucket|_sum|_count|_total)?\b")


def queries(board: dict) -> list[str]:
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert panels, "no panels"
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(p["targets"] for p in panels), "a panel without a query"
    return exprs + [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]


def metric_names(expr: str) -> set[str]:
    return set(_SERIES.findall(expr))


def test_committed_json_is_current():
    assert dashboard.OUTPUT.read_text() == dashboard.render(), f"run `.venv/bin/python {PATH.relative_to(PATH.parents[2])}`"


def test_every_query_names_a_metric_we_export_or_serves():
    board = json.loads(dashboard.OUTPUT.read_text())
    known = {spec.exported for spec in METRICS} | set(dashboard.SERVE_METRICS)
    used: set[str] = set()
    for expr in queries(board):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= known, f"{expr!r} names {names - known}"
        used |= names
    # And every metric we define is on the dashboard.
    assert {spec.exported for spec in METRICS} <= used


def test_metric_name_extraction():
    assert metric_names("histogram_quantile(0.5, sum by (le) (rate(ray_a_seconds_bucket[5m])))") == {"ray_a_seconds"}
    assert metric_names("rate(ray_x_total[1m]) / rate(ray_y_total[1m])") == {"ray_x", "ray_y"}
    assert metric_names("sum(ray_serve_replica_processing_queries)") == {"ray_serve_replica_processing_queries"}


def test_panels_have_unique_ids_and_datasource_variable():
    board = json.loads(dashboard.OUTPUT.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    assert board["uid"] == dashboard.UID
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_the_generator_is_not_in_the_installed_package():
    """grafana-foundation-sdk is a development dependency: nothing installed imports it."""
    import deployments
    import serve_app

    for package in (Path(serve_app.__file__).parent, Path(deployments.__file__).parent):
        assert not [p for p in package.rglob("*.py") if "grafana_foundation_sdk" in p.read_text()]
