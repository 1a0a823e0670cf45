"""The tool loop: server-side tools run inside one response, between its generations.

    prepare      items before the first generation: MCP servers' tool listings, calls the
                 client approved (run like any call); the prompt is rendered again if any
    generate     the engine's tokens into the stream; it stops at a server-side call
    run          the round's calls run (`ResponseTools.run_calls`); each item is completed
                 when its tool has returned
    continue     the prompt of the next round: harmony appends the completion exactly as the
                 model wrote it and the tool messages (`continue_prompt`), so the engine's
                 prefix cache holds everything but the new tokens; it goes to the engine
                 replica of the previous round (`GenerationRequest.replica`). Generate again.

One `Response`, one event stream, one usage total. `max_output_tokens` is a budget over all
rounds; a round that made a call the client answers (a function call, an approval request)
ends the response after its server-side calls ran. The engine stays a token source: this
module is the only place that decides what happens between its generations.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator

from openai.types.responses import ResponseStreamEvent

from serve_app.api.items import CompactionItem, HistoryItem
from serve_app.api.request import ResponsesRequest
from serve_app.core.tokens import GenerationRequest, TokenBatch
from serve_app.runtime.images import prompt_images
from serve_app.runtime.metrics import ToolRound
from serve_app.runtime.offload import big_prompt, off_loop
from serve_app.runtime.turn import Turn, engine_request
from serve_app.state import StoreUnavailable
from serve_app.state.responses import output_as_input
from serve_app.tools.server_tools import ResponseTools

logger = logging.getLogger(__name__)


class ToolRounds:
    """The tool loop of one response (driven by `run.engine_events`)."""

    def __init__(self, turn: Turn, tools: ResponseTools) -> None:
        self.turn, self.tools = turn, tools
        self.completion: list[int] = []  # this generation's tokens
        self.replica: str | None = None  # the engine replica of this generation
        self.rounds = turn.trace.tool_rounds  # each round's timings, for metrics and bench.tool_loop
        self._generations = 1
        self._outputs_before = 0  # output items before this round's
        self._compactions: dict[str, CompactionItem] = {}  # made between rounds, opened, by id

    def saw(self, batch: TokenBatch) -> None:
        self.completion += batch.token_ids
        if batch.replica is not None:
            self.replica = batch.replica
        if self.rounds and self.rounds[-1].next_first_batch is None:
            last = self.rounds[-1]
            last.next_first_batch = time.perf_counter()
            last.prompt_tokens, last.cached_tokens = batch.num_prompt_tokens or 0, batch.num_cached_tokens or 0

    def prepares(self) -> bool:
        """Whether there is work before the first generation (its prompt may change then)."""
        return self.tools.prepares()

    async def prepare(self, deadline: float | None) -> AsyncIterator[list[ResponseStreamEvent]]:
        """Items before the first generation; the first generation is rendered again when
        they changed what the model sees."""
        turn, stream = self.turn, self.turn.stream
        before = len(stream.response.output)
        async for events in self.tools.prepare(stream, deadline):
            yield events
        async for events in self.run_calls(deadline, timed=False):
            yield events
        self._outputs_before = len(stream.response.output)
        if self._outputs_before == before:
            return
        offered = turn.tools_offered()
        stream.server_tools = self.tools.routing()
        history = turn.history + output_as_input(stream.response, stream.tool_texts)
        render = functools.partial(turn.model.family.render_prompt, offered, history)
        prompt = await off_loop(render) if big_prompt(history, len(offered.tools)) else render()
        turn.generation = self._generation(prompt, offered, turn.generation.request_id, pinned=False)
        # The first prompt was charged when it was rendered; the engine is sent this one instead.
        await self._charge(tokens=max(0, len(prompt) - len(turn.prompt)))
        turn.prompt = prompt
        stream.next_round(lambda sink: turn.model.family.parser(sink, prompt))

    async def run_calls(self, deadline: float | None, timed: bool = True) -> AsyncIterator[list[ResponseStreamEvent]]:
        """Run the round's calls (the stream has them), handing in their outcomes."""
        if not self.turn.stream.unfinished_calls:
            return
        timing = ToolRound(generated=time.perf_counter())
        seen = len(self.tools.reports)
        async for events in self.tools.run_calls(self.turn.stream, deadline):
            yield events
        timing.calls_ended = time.perf_counter()
        await self._charge(requests=sum(report.status != "not_run" for report in self.tools.reports[seen:]))
        timing.calls_started = timing.calls_ended - max((report.seconds for report in self.tools.reports[seen:]), default=0.0)
        timing.tool_seconds = timing.calls_ended - timing.calls_started
        if timed:
            self.rounds.append(timing)

    def out_of_budget(self) -> bool:
        budget = self.turn.request.max_output_tokens
        return budget is not None and self.turn.stream.output_tokens >= budget

    async def next_generation(self) -> GenerationRequest:
        """The next round's engine request, once a round's calls ran: the prompt the model
        saw, what it wrote and the tools' messages; the stream takes its tokens next. A long
        conversation is rendered off the event loop (a chat template renders it whole)."""
        turn, stream = self.turn, self.turn.stream
        family = turn.model.family
        offered = turn.tools_offered().model_copy(update={"tool_choice": "auto"})  # a forced call is forced once
        outputs = self._outputs()
        previous = turn.prompt + self.completion
        history = turn.history + outputs
        render = functools.partial(family.continue_prompt, offered, history, turn.prompt, self.completion, outputs[self._outputs_before :])
        prompt = await off_loop(render) if big_prompt(history, len(offered.tools)) else render()
        if turn.compact is not None and turn.compact_threshold is not None and len(prompt) > turn.compact_threshold:
            prompt = await self._compacted(offered, outputs)
        if self.rounds:
            self.rounds[-1].new_tokens = len(prompt) - _common_prefix(previous, prompt)
        self._generations += 1
        generation = self._generation(prompt, offered, f"{stream.response.id}-{self._generations}", pinned=True)
        await self._charge(tokens=len(prompt))  # as `usage` counts it: each round's prompt is input
        turn.prompt, turn.generation, self.completion = prompt, generation, []
        self._outputs_before = len(stream.response.output)
        stream.next_round(lambda sink: family.parser(sink, prompt))
        return generation

    def _outputs(self) -> list[HistoryItem]:
        """The response's output so far as history, its compactions opened."""
        outputs = output_as_input(self.turn.stream.response, self.turn.stream.tool_texts)
        return [self._compactions.get(item.id or "", item) if isinstance(item, CompactionItem) else item for item in outputs]

    async def _compacted(self, offered: ResponsesRequest, outputs: list[HistoryItem]) -> list[int]:
        """`context_management` between rounds: the conversation so far, this response's
        items included, compacted (an output item of the response, read by later turns in
        place of all of it). This response's next round reads the summary, then its own items
        so far as they are: the model goes on from its last call."""
        turn = self.turn
        assert turn.compact is not None  # asked by the caller
        compacted = await turn.compact(turn.history + outputs)
        await self._charge(tokens=compacted.usage.total_tokens if compacted.usage else 0)
        self._compactions[compacted.opened.id or ""] = compacted.opened
        turn.stream.add_compaction(compacted.item)
        history = [*turn.history, compacted.opened, *outputs]
        render = functools.partial(turn.model.family.render_prompt, offered, history)
        prompt = await off_loop(render) if big_prompt(history, len(offered.tools)) else render()
        logger.info("response %s: compacted between tool rounds into %d tokens", turn.stream.response.id, len(prompt))
        return prompt

    async def _charge(self, *, requests: int = 0, tokens: int = 0) -> None:
        """The tenant's quota counts what the loop does on its behalf: each call run as a
        request, each round's prompt as tokens (never refused: past a limit, a debt)."""
        admission = self.turn.admission
        if admission is None or not (requests or tokens):
            return
        try:
            if requests:
                await admission.charge_requests(requests)
            if tokens:
                await admission.charge_tokens(tokens)
        except StoreUnavailable as exc:
            logger.warning("response %s: tool loop not counted in the quota: %s", self.turn.stream.response.id, exc.message)

    def _generation(self, prompt: list[int], offered: ResponsesRequest, request_id: str, *, pinned: bool) -> GenerationRequest:
        previous = self.turn.generation
        return engine_request(
            offered,
            prompt,
            self.turn.model,
            request_id=request_id,
            affinity=previous.affinity_key,
            priority=previous.priority,
            cache_salt=previous.cache_salt,  # the tenant's cached prefix: this round's prompt starts with it
            output_tokens=self.turn.stream.output_tokens,
            replica=self.replica if pinned else None,
            images=prompt_images(self.turn.model.family, prompt, previous.images),  # a round adds tool outputs, never an image
        )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
