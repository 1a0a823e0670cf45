"""`serve_app.runtime.metrics.Metrics` on Ray Serve's metrics, exported by Ray's Prometheus endpoint.

Ray adds the `ray_` prefix on export (counters also get `_total`); Serve tags every series
with `application`, `deployment` and `replica`. `METRICS` lists what this app defines, so the
dashboard (`k8s/grafana/dashboard.py`) and its test can check every panel against it.

Gauges are re-set every `gauge_refresh_s()` by a thread, so their series stay in the scrape
while nothing changes: streams and background runs open per ingress replica, the embedded
store's entries and bytes (`export_store_size`, run by the store replica), and each vLLM
engine's load (`export_engine_load`, run by its engine replica: the numbers of vLLM's own
Prometheus metrics that operators watch, which vLLM cannot export from a Ray replica itself).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray.serve.metrics import Counter, Gauge, Histogram

from serve_app.runtime.metrics import RequestOutcome
from serve_app.tools.server_tools import CallReport

logger = logging.getLogger(__name__)

PREFIX = "responses_serve_"


def gauge_ttl_s(report_interval_ms: int | None = None) -> float:
    """How long Ray keeps a gauge series that is not set again: two report intervals
    (`RAY_metrics_report_interval_ms`, 10 s by default, at least 1 s), as Ray computes it."""
    if report_interval_ms is None:
        import ray

        report_interval_ms = ray._config.metrics_report_interval_ms()
    return 2 * max(report_interval_ms, 1000) / 1000


def gauge_refresh_s(report_interval_ms: int | None = None) -> float:
    """A stream open for minutes would vanish from the scrape: the gauges are re-set four
    times per TTL (every 5 s by default; faster where Ray reports more often)."""
    return gauge_ttl_s(report_interval_ms) / 4


# Seconds. LLM serving spans milliseconds (a token of a small model) to minutes (a long
# answer); the bounds follow vLLM's own histograms, with finer low ends for fast replicas.
TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 40, 80]
TPOT_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5]
# The prompt's rendering on the ingress: well under a millisecond for a short request, a
# tenth of a second or more for a long conversation tokenized whole.
RENDER_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5]
E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200]


@dataclass(frozen=True)
class MetricSpec:
    name: str  # without Ray's `ray_` prefix
    kind: str  # counter | histogram | gauge
    description: str
    tags: tuple[str, ...] = ("model",)

    @property
    def exported(self) -> str:
        """The Prometheus family name of the scrape (histograms add _bucket/_sum/_count)."""
        return f"ray_{self.name}"


REQUESTS = MetricSpec(
    PREFIX + "requests", "counter", "requests by model, endpoint, final status and error code", ("model", "endpoint", "status", "code")
)
# Latencies by the `service_tier` each request was served in, to see what the tiers buy.
MODEL_AND_TIER = ("model", "service_tier")
TTFT = MetricSpec(PREFIX + "time_to_first_token_seconds", "histogram", "request received -> first completion token", MODEL_AND_TIER)
TPOT = MetricSpec(
    PREFIX + "time_per_output_token_seconds", "histogram", "mean time per output token after the first, per request", MODEL_AND_TIER
)
E2E = MetricSpec(PREFIX + "e2e_latency_seconds", "histogram", "request received -> response ended", MODEL_AND_TIER)
PROMPT_TOKENS = MetricSpec(PREFIX + "prompt_tokens", "counter", "prompt tokens")
CACHED_TOKENS = MetricSpec(PREFIX + "cached_tokens", "counter", "prompt tokens served from the prefix cache")
OUTPUT_TOKENS = MetricSpec(PREFIX + "output_tokens", "counter", "completion tokens")
DRAFT_TOKENS = MetricSpec(PREFIX + "speculative_draft_tokens", "counter", "speculative decoding: tokens drafted")
ACCEPTED_TOKENS = MetricSpec(PREFIX + "speculative_accepted_tokens", "counter", "speculative decoding: drafted tokens accepted")
RENDER = MetricSpec(
    PREFIX + "prompt_render_seconds", "histogram", "the prompt's rendering on the ingress replica's event loop (its other streams wait)"
)
RENDER_TOKENS = MetricSpec(
    PREFIX + "prompt_render_tokens",
    "counter",
    "token ids of prompt renders, by source: the ingress's prompt cache, or tokenized",
    ("model", "source"),
)
TRUNCATED = MetricSpec(PREFIX + "truncated_requests", "counter", 'requests whose oldest items truncation "auto" left out of the prompt')
# Server-side tool calls (the tool loop), by the MCP server's label (or the built-in tool's name).
# Labels are the clients' words: past `MAX_TOOL_LABELS` per replica they are counted as "other".
TOOL_CALLS = MetricSpec(
    PREFIX + "tool_calls", "counter", "server-side tool calls by tool (MCP server label), item type and outcome", ("tool", "kind", "status")
)
TOOL_LATENCY = MetricSpec(
    PREFIX + "tool_call_seconds", "histogram", "a server-side tool call's own time, from sending it to its outcome", ("tool", "kind")
)
TOOL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]
MAX_TOOL_LABELS = 64
STREAMS_OPEN = MetricSpec(PREFIX + "streams_open", "gauge", "responses streaming on this ingress replica (SSE and WebSocket)")
BACKGROUND_RUNS = MetricSpec(PREFIX + "background_runs", "gauge", "background responses running on this ingress replica", ())
WEBSOCKETS_OPEN = MetricSpec(PREFIX + "websockets_open", "gauge", "WebSocket connections open on this ingress replica (idle ones too)", ())
# Per tenant (the configured tenants, or "anonymous": a bounded set, never a client's words).
TENANT_REQUESTS = MetricSpec(PREFIX + "tenant_requests", "counter", "requests by tenant and final status", ("tenant", "status"))
TENANT_TOKENS = MetricSpec(PREFIX + "tenant_tokens", "counter", "input and output tokens by tenant", ("tenant", "kind"))
TENANT_REFUSALS = MetricSpec(
    PREFIX + "tenant_refusals",
    "counter",
    "429 (a tenant's limit, by name) and 503 (the server's, by error code) answers by tenant",
    ("tenant", "status", "reason"),
)
STORE_ENTRIES = MetricSpec(PREFIX + "store_entries", "gauge", "keys held by the embedded store (responses, runs, logs, conversations)", ())
STORE_BYTES = MetricSpec(PREFIX + "store_bytes", "gauge", "bytes held by the embedded store (its max_bytes bound counts these)", ())
# A vLLM engine's load, per engine replica (vLLM's vllm:kv_cache_usage_perc, num_requests_*, ...).
ENGINE_KV_CACHE = MetricSpec(
    PREFIX + "engine_kv_cache_usage", "gauge", "fraction of the engine's KV cache in use (0..1; a full cache preempts requests)"
)
ENGINE_RUNNING = MetricSpec(PREFIX + "engine_requests_running", "gauge", "requests the engine is running (in its batch)")
ENGINE_WAITING = MetricSpec(PREFIX + "engine_requests_waiting", "gauge", "requests waiting in the engine for room in its batch")
ENGINE_PREEMPTIONS = MetricSpec(
    PREFIX + "engine_preemptions",
    "counter",
    "requests the engine preempted (their KV cache dropped, to be recomputed) for lack of KV cache",
)
ENGINE_PREFIX_QUERIES = MetricSpec(
    PREFIX + "engine_prefix_cache_queries", "counter", "prompt tokens looked up in the engine's prefix cache"
)
ENGINE_PREFIX_HITS = MetricSpec(PREFIX + "engine_prefix_cache_hits", "counter", "prompt tokens found in the engine's prefix cache")

INGRESS_METRICS = [
    REQUESTS,
    TTFT,
    TPOT,
    E2E,
    PROMPT_TOKENS,
    CACHED_TOKENS,
    OUTPUT_TOKENS,
    DRAFT_TOKENS,
    ACCEPTED_TOKENS,
    TRUNCATED,
    RENDER,
    RENDER_TOKENS,
    TOOL_CALLS,
    TOOL_LATENCY,
    STREAMS_OPEN,
    BACKGROUND_RUNS,
    WEBSOCKETS_OPEN,
    TENANT_REQUESTS,
    TENANT_TOKENS,
    TENANT_REFUSALS,
]
STORE_METRICS = [STORE_ENTRIES, STORE_BYTES]  # set by the embedded store's replica
ENGINE_METRICS = [ENGINE_KV_CACHE, ENGINE_RUNNING, ENGINE_WAITING, ENGINE_PREEMPTIONS, ENGINE_PREFIX_QUERIES, ENGINE_PREFIX_HITS]
METRICS = INGRESS_METRICS + STORE_METRICS + ENGINE_METRICS
_BUCKETS = {TTFT: TTFT_BUCKETS, TPOT: TPOT_BUCKETS, E2E: E2E_BUCKETS, RENDER: RENDER_BUCKETS, TOOL_LATENCY: TOOL_BUCKETS}


def _make(spec: MetricSpec) -> Any:
    """The Ray metric of `spec.kind`: a `Counter`, `Histogram` or `Gauge` (Any: each caller
    knows which kind its spec is and calls its `inc`, `observe` or `set`)."""
    if spec.kind == "counter":
        return Counter(spec.name, spec.description, tag_keys=spec.tags)  # type: ignore[arg-type]  # Ray's hint says tuple[str]; it takes any tuple
    if spec.kind == "histogram":
        return Histogram(spec.name, spec.description, boundaries=_BUCKETS[spec], tag_keys=spec.tags)  # type: ignore[arg-type]
    return Gauge(spec.name, spec.description, tag_keys=spec.tags)  # type: ignore[arg-type]


class RayServeMetrics:
    """One per ingress replica: a request reports once, a stream when it opens and closes."""

    def __init__(self) -> None:
        self._metrics = {spec: _make(spec) for spec in INGRESS_METRICS}
        self._open: dict[str, int] = {}
        self._tool_labels: set[str] = set()
        self._background = 0
        self._websockets = 0
        _refresh_forever(self._set_gauges)

    def request_finished(self, outcome: RequestOutcome) -> None:
        model = {"model": outcome.model}
        model_and_tier = {**model, "service_tier": outcome.service_tier}
        self._metrics[REQUESTS].inc(1, {**model, "endpoint": outcome.endpoint, "status": outcome.status, "code": outcome.code})
        self._metrics[E2E].observe(outcome.e2e_s, model_and_tier)
        if outcome.ttft_s is not None:
            self._metrics[TTFT].observe(outcome.ttft_s, model_and_tier)
        if outcome.tpot_s is not None:
            self._metrics[TPOT].observe(outcome.tpot_s, model_and_tier)
        for spec, value in (
            (PROMPT_TOKENS, outcome.prompt_tokens),
            (CACHED_TOKENS, outcome.cached_tokens),
            (OUTPUT_TOKENS, outcome.output_tokens),
            (DRAFT_TOKENS, outcome.draft_tokens),
            (ACCEPTED_TOKENS, outcome.accepted_tokens),
        ):
            if value > 0:  # Ray's Counter.inc rejects 0
                self._metrics[spec].inc(value, model)
        if outcome.truncated_items > 0:
            self._metrics[TRUNCATED].inc(1, model)
        if outcome.render_s is not None:
            self._metrics[RENDER].observe(outcome.render_s, model)
        for source, value in (("cache", outcome.prompt_reused_tokens), ("tokenized", outcome.prompt_tokenized_tokens)):
            if value > 0:
                self._metrics[RENDER_TOKENS].inc(value, {**model, "source": source})
        if outcome.tenant:
            self._metrics[TENANT_REQUESTS].inc(1, {"tenant": outcome.tenant, "status": outcome.status})
            for kind, value in (("input", outcome.prompt_tokens), ("output", outcome.output_tokens)):
                if value > 0:
                    self._metrics[TENANT_TOKENS].inc(value, {"tenant": outcome.tenant, "kind": kind})

    def refused(self, tenant: str, status: int, reason: str) -> None:
        self._metrics[TENANT_REFUSALS].inc(1, {"tenant": tenant, "status": str(status), "reason": reason})

    def tool_call_finished(self, report: CallReport) -> None:
        if report.label not in self._tool_labels and len(self._tool_labels) < MAX_TOOL_LABELS:
            self._tool_labels.add(report.label)
        tool = {"tool": report.label if report.label in self._tool_labels else "other", "kind": report.kind}
        self._metrics[TOOL_CALLS].inc(1, {**tool, "status": report.status})
        if report.status in ("completed", "failed"):
            self._metrics[TOOL_LATENCY].observe(report.seconds, tool)

    def stream_opened(self, model: str) -> None:
        self._set_open(model, +1)

    def stream_closed(self, model: str) -> None:
        self._set_open(model, -1)

    def background_runs(self, running: int) -> None:
        self._background = running
        self._metrics[BACKGROUND_RUNS].set(running)

    def websockets_open(self, count: int) -> None:
        self._websockets = count
        self._metrics[WEBSOCKETS_OPEN].set(count)

    def _set_open(self, model: str, change: int) -> None:
        count = self._open[model] = self._open.get(model, 0) + change
        self._metrics[STREAMS_OPEN].set(count, {"model": model})

    def _set_gauges(self) -> None:
        for model, count in list(self._open.items()):
            self._metrics[STREAMS_OPEN].set(count, {"model": model})
        self._metrics[BACKGROUND_RUNS].set(self._background)
        self._metrics[WEBSOCKETS_OPEN].set(self._websockets)


def export_store_size(stats: Callable[[], dict[str, int]]) -> None:
    """The embedded store replica's size as gauges (`stats()`: its `entries` and `bytes`)."""
    entries, size = _make(STORE_ENTRIES), _make(STORE_BYTES)

    def set_gauges() -> None:
        now = stats()
        entries.set(now["entries"])
        size.set(now["bytes"])

    _refresh_forever(set_gauges)


# `EngineLoad.snapshot()` keys (serve_app/engines/vllm.py) of each metric.
_ENGINE_GAUGES = {ENGINE_KV_CACHE: "kv_cache_usage", ENGINE_RUNNING: "running", ENGINE_WAITING: "waiting"}
_ENGINE_COUNTERS = {
    ENGINE_PREEMPTIONS: "preemptions",
    ENGINE_PREFIX_QUERIES: "prefix_cache_queries",
    ENGINE_PREFIX_HITS: "prefix_cache_hits",
}


def export_engine_load(model: str, load: Callable[[], dict[str, float]]) -> None:
    """A vLLM engine replica's load (`load()`: `VLLMBackend.engine_load`) as Ray metrics: the
    gauges set, the counters advanced by what the engine's totals grew since the last look."""
    tags = {"model": model}
    gauges = {spec: _make(spec) for spec in _ENGINE_GAUGES}
    counters = {spec: _make(spec) for spec in _ENGINE_COUNTERS}
    seen = dict.fromkeys(_ENGINE_COUNTERS.values(), 0.0)

    def update() -> None:
        now = load()
        for spec, key in _ENGINE_GAUGES.items():
            gauges[spec].set(now[key], tags)
        for spec, key in _ENGINE_COUNTERS.items():
            grown, seen[key] = now[key] - seen[key], now[key]
            if grown > 0:  # Ray's Counter.inc refuses 0
                counters[spec].inc(grown, tags)

    _refresh_forever(update)


def _refresh_forever(set_gauges: Callable[[], None]) -> None:
    """Call `set_gauges` now and then every `gauge_refresh_s()`, in a daemon thread."""
    period_s = gauge_refresh_s()

    def loop() -> None:
        while True:
            try:
                set_gauges()
            except Exception:
                logger.exception("metrics: refreshing the gauges failed")
            time.sleep(period_s)

    threading.Thread(target=loop, name="metrics-gauges", daemon=True).start()
