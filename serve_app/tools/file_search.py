"""`file_search`: a search of the caller's vector stores as a `Toolset` of the response.

- Offer: both families get one tool `file_search` of `{"query": string}` (harmony models in
  the system message, as gpt-oss's own tools are; chat-template models as a function). The
  model calls it as `call file_search {"query": "..."}` in the replay models' script.
- A call searches the request's `vector_store_ids` (hybrid: semantic + BM25, fused; the
  tool's `max_num_results`, `ranking_options` and `filters`, out of the model's reach) and
  becomes a `file_search_call` item whose `results` are there only with `include:
  ["file_search_call.results"]`.
- The model reads each result under a numbered marker `【N†FILENAME】`; citing a marker in
  its answer makes a `file_citation` annotation (core/citations.py), the marker taken out.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from serve_app.api.errors import APIError
from serve_app.api.filters import Filter
from serve_app.api.items import HistoryItem
from serve_app.api.request import ResponsesRequest
from serve_app.api.tools import BuiltinTool, FileSearchRanking, FileSearchTool, Tool
from serve_app.core.citations import CitedFile
from serve_app.core.tool_items import FILE_SEARCH_CALL, ServerCall, ServerTools, ToolError, ToolOutcome, file_search_query
from serve_app.core.utf8 import cap_text
from serve_app.families.hosted import FILE_SEARCH
from serve_app.retrieval.index import Hit, Ranking
from serve_app.tools.server_tools import NothingToPrepare

INCLUDE_RESULTS = "file_search_call.results"
DEFAULT_MAX_RESULTS = 10
MAX_QUERY_CHARS = 4096
MAX_TEXT_BYTES = 256 * 1024  # what the model reads of one search
CITE_BASE_WITH_BROWSER = 1000  # beside the browser's cursors, file_search's markers start here
DESCRIPTION = (
    "Search the documents the user made available (their vector stores) for passages relevant to a query. "
    'Call it with {"query": "<what to look for>"}. Each result is shown under a marker such as 【3†report.pdf】 '
    "followed by the passage. Answer from the passages; cite each passage you use by writing its marker, "
    "exactly as shown, right after the sentence it supports."
)
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "What to look for in the documents."}},
    "required": ["query"],
}

# (vector_store_ids, query, max_results, ranking, filters) -> hits; 404/400 `APIError`s for stores
Searcher = Callable[[Sequence[str], str, int, Ranking, Filter | None], Awaitable[list[Hit]]]


def ranking_of(tool: FileSearchTool) -> Ranking:
    return ranking_of_options(tool.ranking_options)


def ranking_of_options(options: FileSearchRanking | None) -> Ranking:
    """`ranking_options` as the index ranks: the hybrid weights (default 1 and 1) and the threshold."""
    if options is None:
        return Ranking()
    weights = options.hybrid_search
    return Ranking(
        embedding_weight=weights.embedding_weight if weights else 1.0,
        text_weight=weights.text_weight if weights else 1.0,
        score_threshold=options.score_threshold or 0.0,
    )


class FileSearchTools(NothingToPrepare):
    """file_search for one response."""

    def __init__(self, tool: FileSearchTool, search: Searcher, *, include_results: bool) -> None:
        self.tool, self.search, self.include_results = tool, search, include_results
        self.cited: dict[int, CitedFile] = {}
        self.base = 0
        self._next = 0

    def offer(self, request: ResponsesRequest) -> ResponsesRequest:
        tool = BuiltinTool(name=FILE_SEARCH, description=DESCRIPTION, serves="file_search", parameters=PARAMETERS)
        return request.model_copy(update={"tools": [*request.tools, tool]})

    def route(self, tools: ServerTools) -> None:
        tools.names[FILE_SEARCH] = FILE_SEARCH_CALL
        if tools.citations is None or tools.citations is self.cited:
            tools.citations = self.cited
        else:  # the browser's cursors too: file_search's markers are numbered apart
            self.base = CITE_BASE_WITH_BROWSER
            tools.citations = (
                ChainMap(self.cited, dict(tools.citations))
                if not isinstance(tools.citations, dict)
                else ChainMap(self.cited, tools.citations)
            )

    def owns(self, call: ServerCall) -> bool:
        return call.kind is FILE_SEARCH_CALL

    def label(self, call: ServerCall) -> str:
        return FILE_SEARCH

    async def run(self, call: ServerCall) -> ToolOutcome:
        query = file_search_query(call.arguments)
        if query is None or not query.strip():
            return _failed('Not searched: the arguments must be a JSON object {"query": "<text>"}.')
        query = query[:MAX_QUERY_CHARS]
        max_results = self.tool.max_num_results or DEFAULT_MAX_RESULTS
        try:
            hits = await self.search(self.tool.vector_store_ids, query, max_results, ranking_of(self.tool), self.tool.filters)
        except APIError as exc:
            return _failed(f"Not searched: {exc.message}")
        blocks = []
        for hit in hits:
            marker = self.base + self._next
            self._next += 1
            self.cited[marker] = CitedFile(hit.file_id, hit.filename)
            blocks.append(f"【{marker}†{hit.filename}】\n{hit.text}")
        text = cap_text("\n\n".join(blocks), MAX_TEXT_BYTES) if blocks else "No results found."
        item: dict[str, Any] = {}
        if self.include_results:
            item["results"] = [
                {"file_id": h.file_id, "filename": h.filename, "score": h.score, "text": h.text, "attributes": h.attributes or None}
                for h in hits
            ]
        return ToolOutcome(output=text, model_text=text, item=item)

    async def aclose(self) -> None:
        return None


def _failed(text: str) -> ToolOutcome:
    return ToolOutcome(error=ToolError("mcp_tool_execution_error", text), model_text=text)


class FileSearchFactory:
    """A request's `file_search` becomes a toolset of its response when the server has
    vector stores (`searcher(tenant)`: the tenant's search; None: no vector stores here, the
    tool is left out of the response)."""

    def __init__(self, searcher: Callable[[str], Searcher | None], *, enabled: bool = True) -> None:
        self.searcher, self.enabled = searcher, enabled

    def check(self, request: ResponsesRequest) -> list[Tool]:
        """Without vector stores on this server, file_search is left out of the response."""
        return [] if self.enabled else [tool for tool in request.tools if isinstance(tool, FileSearchTool)]

    def __call__(
        self, request: ResponsesRequest, history: list[HistoryItem], input_items: list[HistoryItem], tenant: str
    ) -> FileSearchTools | None:
        tool = request.file_search_tool()
        search = self.searcher(tenant) if tool is not None else None
        if tool is None or search is None:
            return None
        return FileSearchTools(tool, search, include_results=INCLUDE_RESULTS in request.include)
