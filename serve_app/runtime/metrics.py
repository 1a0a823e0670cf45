"""What the HTTP surface reports about its requests, behind an interface with no Ray in it.

`create_app(metrics=...)` takes any `Metrics`; `deployments/metrics.py` implements it with
Ray Serve's metrics (exported by Ray's Prometheus endpoint). The hot path stays cheap: a
request reports once when it ends (a `RequestOutcome`), a stream when it opens and closes;
nothing is reported per token. `GuardedMetrics` wraps every implementation, so a metric
that raises is logged and never fails a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from openai.types.responses import Response

from serve_app.api.errors import APIError
from serve_app.core.tokens import TokenBatch
from serve_app.tools.server_tools import CallReport

logger = logging.getLogger(__name__)

# completed / incomplete / failed: the response's own status. cancelled: the client went
# away mid-stream. rejected: an error answer (4xx/5xx) instead of a response.
Status = Literal["completed", "incomplete", "failed", "cancelled", "rejected"]
# The API a request came by: /v1/responses, /v1/responses/compact, /v1/chat/completions, /v1/completions.
Endpoint = Literal["responses", "responses.compact", "chat.completions", "completions"]


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request of a model (`/v1/responses` and the others), reported once when it ends."""

    model: str  # a served model's name; "" when the request named none we serve
    status: Status
    code: str  # the error's `code` ("" when none)
    e2e_s: float  # request received -> last byte produced
    ttft_s: float | None = None  # request received -> first completion token
    tpot_s: float | None = None  # mean time per output token after the first
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: tokens proposed
    accepted_tokens: int = 0  # ... and accepted by the target model
    truncated_items: int = 0  # history items `truncation: "auto"` left out of the prompt
    render_s: float | None = None  # the prompt's rendering on the ingress's event loop
    prompt_reused_tokens: int = 0  # token ids of the renders taken from the prompt cache
    prompt_tokenized_tokens: int = 0  # ... and tokenized
    service_tier: str = "default"  # the tier it was served in (api/service_tier.py)
    tenant: str = ""  # the caller's tenant ("" before it was known)
    endpoint: Endpoint = "responses"


@dataclass(slots=True)
class ToolRound:
    """One tool round's timings (perf_counter seconds) and its next generation's prompt."""

    generated: float  # the round's generation ended
    calls_started: float = 0.0
    calls_ended: float = 0.0
    next_first_batch: float | None = None  # the next generation's first batch came
    tool_seconds: float = 0.0  # the tools' own time (the longest call of the round)
    prompt_tokens: int = 0  # of the next generation
    cached_tokens: int = 0
    new_tokens: int = 0  # tokens the next prompt adds to the previous prompt and completion


@dataclass(slots=True)
class RequestTrace:
    """Timings and counts of one request, updated per token batch (not per token)."""

    model: str = ""
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    truncated_items: int = 0
    render_s: float | None = None
    prompt_reused_tokens: int = 0
    prompt_tokenized_tokens: int = 0
    service_tier: str = "default"
    tenant: str = ""
    endpoint: Endpoint = "responses"  # which API the request came by
    tool_rounds: list[ToolRound] = field(default_factory=list)  # the tool loop's rounds
    reported: bool = False

    def saw(self, batch: TokenBatch) -> None:
        if self.first_token is None and batch.token_ids:
            self.first_token = time.perf_counter()
        if batch.num_prompt_tokens is not None:
            self.prompt_tokens = batch.num_prompt_tokens
        if batch.num_cached_tokens is not None:
            self.cached_tokens = batch.num_cached_tokens
        self.output_tokens += len(batch.token_ids)
        self.draft_tokens += batch.num_draft_tokens
        self.accepted_tokens += batch.num_accepted_tokens

    def outcome(self, status: Status, code: str | None = None) -> RequestOutcome:
        now = time.perf_counter()
        ttft = tpot = None
        if self.first_token is not None:
            ttft = self.first_token - self.started
            if self.output_tokens > 1:
                tpot = (now - self.first_token) / (self.output_tokens - 1)
        return RequestOutcome(
            model=self.model,
            status=status,
            code=code or "",
            e2e_s=now - self.started,
            ttft_s=ttft,
            tpot_s=tpot,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            truncated_items=self.truncated_items,
            render_s=self.render_s,
            endpoint=self.endpoint,
            prompt_reused_tokens=self.prompt_reused_tokens,
            prompt_tokenized_tokens=self.prompt_tokenized_tokens,
            service_tier=self.service_tier,
            tenant=self.tenant,
        )


class Metrics(Protocol):
    def request_finished(self, outcome: RequestOutcome) -> None: ...
    def tool_call_finished(self, report: CallReport) -> None: ...  # a server-side tool call (the tool loop)
    def stream_opened(self, model: str) -> None: ...
    def stream_closed(self, model: str) -> None: ...
    def background_runs(self, running: int) -> None: ...  # background responses running here
    def websockets_open(self, count: int) -> None: ...  # WebSocket connections open here
    def refused(self, tenant: str, status: int, reason: str) -> None: ...  # a 429 or 503 answer, by reason


class NoMetrics:
    """The default: report nothing (in-process runs, unit tests)."""

    def request_finished(self, outcome: RequestOutcome) -> None:
        pass

    def tool_call_finished(self, report: CallReport) -> None:
        pass

    def stream_opened(self, model: str) -> None:
        pass

    def stream_closed(self, model: str) -> None:
        pass

    def background_runs(self, running: int) -> None:
        pass

    def websockets_open(self, count: int) -> None:
        pass

    def refused(self, tenant: str, status: int, reason: str) -> None:
        pass


class GuardedMetrics:
    """Any `Metrics`, with every call shielded: metrics must never fail a request."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._warned = False

    def request_finished(self, outcome: RequestOutcome) -> None:
        self._call(self._metrics.request_finished, outcome)

    def tool_call_finished(self, report: CallReport) -> None:
        self._call(self._metrics.tool_call_finished, report)

    def stream_opened(self, model: str) -> None:
        self._call(self._metrics.stream_opened, model)

    def stream_closed(self, model: str) -> None:
        self._call(self._metrics.stream_closed, model)

    def background_runs(self, running: int) -> None:
        self._call(self._metrics.background_runs, running)

    def websockets_open(self, count: int) -> None:
        self._call(self._metrics.websockets_open, count)

    def refused(self, tenant: str, status: int, reason: str) -> None:
        self._call(self._metrics.refused, tenant, status, reason)

    def _call(self, method: Callable[..., None], *arguments: Any) -> None:
        try:
            method(*arguments)
        except Exception:
            if not self._warned:  # once: a broken exporter must not flood the log either
                self._warned = True
                logger.exception("metrics: %s failed; requests are not affected", method.__name__)


def report_once(metrics: Metrics, trace: RequestTrace | None, status: Status, code: str | None = None) -> None:
    """Report a request when it ends, once (the error handlers may see it after the route)."""
    if trace is not None and not trace.reported:
        trace.reported = True
        metrics.request_finished(trace.outcome(status, code))


def report_refusal(metrics: Metrics, scope: Mapping[str, Any], error: APIError) -> None:
    """Count a 429 (a tenant's limit, named: `requests_per_minute`, ...) or a 503 (the server's,
    by its code) against the caller's tenant."""
    if error.status_code in (429, 503):
        tenant = scope.get("state", {}).get("tenant") or ""
        metrics.refused(tenant, error.status_code, getattr(error, "limit", None) or error.code or "")


def report_response(metrics: Metrics, trace: RequestTrace | None, response: Response) -> None:
    """Report a request that ended with `response`: its status and its error's code."""
    status = cast(Status, response.status)  # reported once it ended: a final status
    report_once(metrics, trace, status, response.error.code if response.error else None)
