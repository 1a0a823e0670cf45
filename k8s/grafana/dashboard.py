"""The Grafana dashboard, as code (grafana-foundation-sdk, a dev dependency): from a clone,
`.venv/bin/python k8s/grafana/dashboard.py`.

Writes `responses-serve.json` beside this file (committed; tests/k8s/test_grafana_dashboard.py
keeps it equal to a fresh generation). Panels show the metrics of `deployments.metrics`
and Ray Serve's own replica and queue metrics (`SERVE_METRICS`), as Ray's Prometheus endpoint
exports them. How to load it: k8s/README.md. Not part of the installed package: its
dependency is a development one.
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

from deployments.metrics import (
    ACCEPTED_TOKENS,
    BACKGROUND_RUNS,
    CACHED_TOKENS,
    DRAFT_TOKENS,
    E2E,
    ENGINE_KV_CACHE,
    ENGINE_PREEMPTIONS,
    ENGINE_PREFIX_HITS,
    ENGINE_PREFIX_QUERIES,
    ENGINE_RUNNING,
    ENGINE_WAITING,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    RENDER,
    RENDER_TOKENS,
    REQUESTS,
    STORE_BYTES,
    STORE_ENTRIES,
    STREAMS_OPEN,
    TENANT_REFUSALS,
    TENANT_REQUESTS,
    TENANT_TOKENS,
    TOOL_CALLS,
    TOOL_LATENCY,
    TPOT,
    TRUNCATED,
    TTFT,
    WEBSOCKETS_OPEN,
    MetricSpec,
)

OUTPUT = Path(__file__).resolve().parent / "responses-serve.json"
UID = "responses-serve"

# Ray Serve's own metrics used here (Ray 2.x names, as exported with the `ray_` prefix).
SERVE_METRICS = {
    "ray_serve_deployment_replica_healthy": "1 per healthy replica",
    "ray_serve_autoscaling_target_replicas": "replicas the autoscaler aims for",
    "ray_serve_num_ongoing_requests_at_replicas": "requests assigned to a deployment's replicas, by its handles",
    "ray_serve_replica_processing_queries": "requests a replica is running",
    "ray_serve_deployment_queued_queries": "requests queued in handles, not yet assigned to a replica",
    "ray_serve_deployment_request_counter": "requests a replica has processed",
    "ray_serve_deployment_error_counter": "exceptions a replica's requests raised",
    "ray_serve_deployment_processing_latency_ms": "time a replica spent on a request",
}

_DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
_MODEL = 'model=~"$model"'
_APP = 'application=~"$application"'
_RATE = "[$__rate_interval]"


def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(_DATASOURCE)


def _panel(title: str, unit: str, *queries: prometheus.Dataquery, description: str = "", width: int = 12) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(_DATASOURCE).span(width).height(8)
    if description:
        panel = panel.description(description)
    for query in queries:
        panel = panel.with_target(query)
    return panel


def _rate(spec: MetricSpec, suffix: str, by: str, matchers: str = _MODEL) -> str:
    return f"sum by ({by}) (rate({spec.exported}{suffix}{{{matchers}}}{_RATE}))"


def _sum_by(by: str, metric: str, legend: str, rate: bool = False) -> prometheus.Dataquery:
    """`metric` of the selected application(s), summed per `by` (its rate with `rate`)."""
    series = f"{metric}{{{_APP}}}"
    return _query(f"sum by ({by}) ({f'rate({series}{_RATE})' if rate else series})", legend)


def _state_panel(title: str, unit: str, spec: MetricSpec, description: str) -> timeseries.Panel:
    """One gauge of the app's state per application, a third of the row wide."""
    return _panel(title, unit, _sum_by("application", spec.exported, "{{application}}"), description=description, width=8)


def _quantiles(spec: MetricSpec, title: str) -> timeseries.Panel:
    queries = [
        _query(f"histogram_quantile({q}, {_rate(spec, '_bucket', 'le, model')})", f"p{round(q * 100)} {{{{model}}}}")
        for q in (0.5, 0.9, 0.99)
    ]
    return _panel(title, "s", *queries, description=spec.description)


def build() -> dashboard.Dashboard:
    requests = f"{REQUESTS.exported}_total"
    spec_rate = f"sum by (model) (rate({ACCEPTED_TOKENS.exported}_total{{{_MODEL}}}{_RATE})) / sum by (model) (rate({DRAFT_TOKENS.exported}_total{{{_MODEL}}}{_RATE}))"
    return (
        dashboard.Dashboard("responses-serve")
        .uid(UID)
        .tags(["responses-serve", "ray-serve", "llm"])
        .refresh("10s")
        .time("now-1h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("application")
            .label("Serve application")
            .datasource(_DATASOURCE)
            .query(f"label_values({requests}, application)")
            .include_all(True)
            .multi(True)
            .all_value(".*")
        )
        .with_variable(
            dashboard.QueryVariable("model")
            .label("Model")
            .datasource(_DATASOURCE)
            .query(f"label_values({requests}, model)")
            .include_all(True)
            .multi(True)
            .all_value(".*")
        )
        .with_row(dashboard.Row("Requests"))
        .with_panel(
            _panel(
                "Requests/s by model and status",
                "reqps",
                _query(f"sum by (model, status) (rate({requests}{{{_MODEL}}}{_RATE}))", "{{model}} {{status}}"),
                _query(_rate(TRUNCATED, "_total", "model"), "truncated {{model}}"),
                description=REQUESTS.description + "; truncated: " + TRUNCATED.description,
            )
        )
        .with_panel(
            _panel(
                "Errors/s by code",
                "reqps",
                _query(
                    f'sum by (model, status, code) (rate({requests}{{{_MODEL}, status=~"failed|rejected"}}{_RATE}))',
                    "{{model}} {{status}} {{code}}",
                ),
                description="failed: the response ended with response.failed; rejected: a 4xx/5xx error instead of a response",
            )
        )
        .with_panel(
            _panel(
                "Streams open",
                "short",
                _query(f"sum by (model) ({STREAMS_OPEN.exported}{{{_MODEL}}})", "{{model}}"),
                description=STREAMS_OPEN.description,
            )
        )
        .with_panel(_quantiles(E2E, "End-to-end latency"))
        .with_row(dashboard.Row("Latency"))
        .with_panel(_quantiles(TTFT, "Time to first token"))
        .with_panel(_quantiles(TPOT, "Time per output token"))
        .with_panel(
            _panel(
                "p90 latency by service tier",
                "s",
                *[
                    _query(
                        f"histogram_quantile(0.9, {_rate(spec, '_bucket', 'le, model, service_tier')})",
                        f"{name} {{{{model}}}} {{{{service_tier}}}}",
                    )
                    for spec, name in ((TTFT, "first token"), (E2E, "end to end"))
                ],
                description="what each service_tier was served in: priority goes first where requests wait, in the "
                "ingress's router and in a priority-scheduled vLLM engine (models[].backend.scheduling_policy)",
                width=24,
            )
        )
        .with_row(dashboard.Row("Prompt rendering (ingress)"))
        .with_panel(_quantiles(RENDER, "Prompt render time"))
        .with_panel(
            _panel(
                "Prompt tokens/s by source",
                "short",
                _query(_rate(RENDER_TOKENS, "_total", "model, source"), "{{source}} {{model}}"),
                description=RENDER_TOKENS.description + " (cache: a turn's history rendered before on that replica; "
                "see models[].prompt_cache_tokens)",
            )
        )
        .with_row(dashboard.Row("Server-side tools (the tool loop)"))
        .with_panel(
            _panel(
                "Tool calls/s by tool and outcome",
                "reqps",
                _query(_rate(TOOL_CALLS, "_total", "tool, kind, status", _APP), "{{tool}} {{kind}} {{status}}"),
                description=TOOL_CALLS.description + " (not_run: past max_tool_calls; cancelled: the response ended first)",
            )
        )
        .with_panel(
            _panel(
                "Tool call time",
                "s",
                *[
                    _query(
                        f"histogram_quantile({q}, {_rate(TOOL_LATENCY, '_bucket', 'le, tool', _APP)})", f"p{round(q * 100)} {{{{tool}}}}"
                    )
                    for q in (0.5, 0.99)
                ],
                description=TOOL_LATENCY.description,
            )
        )
        .with_row(dashboard.Row("Tokens and speculative decoding"))
        .with_panel(
            _panel(
                "Tokens/s",
                "short",
                _query(_rate(OUTPUT_TOKENS, "_total", "model"), "output {{model}}"),
                _query(_rate(PROMPT_TOKENS, "_total", "model"), "prompt {{model}}"),
                _query(_rate(CACHED_TOKENS, "_total", "model"), "cached prompt {{model}}"),
            )
        )
        .with_panel(
            _panel(
                "Speculative decoding",
                "short",
                _query(_rate(DRAFT_TOKENS, "_total", "model"), "drafted/s {{model}}"),
                _query(_rate(ACCEPTED_TOKENS, "_total", "model"), "accepted/s {{model}}"),
                _query(spec_rate, "acceptance rate {{model}}"),
                description="acceptance rate = accepted / drafted tokens (right axis would be 0..1)",
            )
        )
        .with_row(dashboard.Row("vLLM engines"))
        .with_panel(
            _panel(
                "KV cache use",
                "percentunit",
                _query(f"max by (model) ({ENGINE_KV_CACHE.exported}{{{_MODEL}}})", "fullest replica {{model}}"),
                _query(f"avg by (model) ({ENGINE_KV_CACHE.exported}{{{_MODEL}}})", "mean {{model}}"),
                description=ENGINE_KV_CACHE.description + "; per engine replica, its fullest engine core",
            )
        )
        .with_panel(
            _panel(
                "Engine requests running and waiting",
                "short",
                _query(f"sum by (model) ({ENGINE_RUNNING.exported}{{{_MODEL}}})", "running {{model}}"),
                _query(f"sum by (model) ({ENGINE_WAITING.exported}{{{_MODEL}}})", "waiting {{model}}"),
                description="running: "
                + ENGINE_RUNNING.description
                + "; waiting: "
                + ENGINE_WAITING.description
                + " (max_num_seqs, KV cache); requests queued in Serve before an engine replica: below",
            )
        )
        .with_panel(
            _panel(
                "Preemptions/s",
                "short",
                _query(_rate(ENGINE_PREEMPTIONS, "_total", "model"), "{{model}}"),
                description=ENGINE_PREEMPTIONS.description + ": more KV cache (gpu_memory_utilization, a larger "
                "GPU) or fewer sequences per engine (max_num_seqs) if this is not 0",
            )
        )
        .with_panel(
            _panel(
                "Prefix cache hit rate",
                "percentunit",
                _query(
                    f"{_rate(ENGINE_PREFIX_HITS, '_total', 'model')} / {_rate(ENGINE_PREFIX_QUERIES, '_total', 'model')}",
                    "{{model}}",
                ),
                description="prompt tokens found in the engines' prefix caches / prompt tokens looked up",
            )
        )
        .with_row(dashboard.Row("State"))
        .with_panel(
            _state_panel(
                "Background responses running",
                "short",
                BACKGROUND_RUNS,
                BACKGROUND_RUNS.description + "; they end in the requests panel with their final status",
            )
        )
        .with_panel(
            _state_panel(
                "WebSocket connections open",
                "short",
                WEBSOCKETS_OPEN,
                WEBSOCKETS_OPEN.description + ": each holds its own responses' chain (store: false too) "
                "and counts as an ongoing request for Serve's autoscaling and drain",
            )
        )
        .with_panel(
            _state_panel(
                "Embedded store entries", "short", STORE_ENTRIES, STORE_ENTRIES.description + " (a Redis store: watch Redis itself)"
            )
        )
        .with_panel(_state_panel("Embedded store size", "bytes", STORE_BYTES, STORE_BYTES.description))
        .with_row(dashboard.Row("Tenants"))
        .with_panel(
            _panel(
                "Requests/s by tenant and status",
                "reqps",
                _sum_by("tenant, status", f"{TENANT_REQUESTS.exported}_total", "{{tenant}} {{status}}", rate=True),
                description=TENANT_REQUESTS.description,
                width=8,
            )
        )
        .with_panel(
            _panel(
                "Tokens/s by tenant",
                "short",
                _sum_by("tenant, kind", f"{TENANT_TOKENS.exported}_total", "{{tenant}} {{kind}}", rate=True),
                description=TENANT_TOKENS.description + " (what tokens_per_minute counts)",
                width=8,
            )
        )
        .with_panel(
            _panel(
                "Refusals/s by tenant and reason",
                "reqps",
                _sum_by("tenant, status, reason", f"{TENANT_REFUSALS.exported}_total", "{{tenant}} {{status}} {{reason}}", rate=True),
                description=TENANT_REFUSALS.description,
                width=8,
            )
        )
        .with_row(dashboard.Row("Ray Serve replicas and queues"))
        .with_panel(
            _panel(
                "Healthy replicas (and autoscaling target)",
                "short",
                _sum_by("deployment", "ray_serve_deployment_replica_healthy", "healthy {{deployment}}"),
                _sum_by("deployment", "ray_serve_autoscaling_target_replicas", "target {{deployment}}"),
            )
        )
        .with_panel(
            _panel(
                "Requests at replicas and queued",
                "short",
                _sum_by("deployment", "ray_serve_num_ongoing_requests_at_replicas", "ongoing {{deployment}}"),
                _sum_by("deployment", "ray_serve_replica_processing_queries", "processing {{deployment}}"),
                _sum_by("deployment", "ray_serve_deployment_queued_queries", "queued {{deployment}}"),
                description="queued: waiting in a handle for a replica with room (max_ongoing_requests)",
            )
        )
        .with_panel(
            _panel(
                "Replica requests and errors/s",
                "reqps",
                _sum_by("deployment", "ray_serve_deployment_request_counter_total", "requests {{deployment}}", rate=True),
                _sum_by("deployment", "ray_serve_deployment_error_counter_total", "errors {{deployment}}", rate=True),
            )
        )
        .with_panel(
            _panel(
                "Replica processing latency p99",
                "ms",
                _query(
                    "histogram_quantile(0.99, sum by (le, deployment) "
                    f"(rate(ray_serve_deployment_processing_latency_ms_bucket{{{_APP}}}{_RATE})))",
                    "{{deployment}}",
                ),
                description="for a streaming call: until its last token batch",
            )
        )
    )


def render() -> str:
    model = build().build()
    # Grafana wants unique panel ids and per-panel query refIds; the builders leave them unset.
    for panel_id, panel in enumerate(model.panels or [], start=1):
        panel.id_val = panel_id
        for ref, target in zip("ABCDEFGH", getattr(panel, "targets", None) or []):
            target.ref_id = ref
    return json.dumps(json.loads(JSONEncoder().encode(model)), indent=2, sort_keys=True) + "\n"


def main() -> None:
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
