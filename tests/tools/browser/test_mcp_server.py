"""The browser MCP server on loopback, driven through the official `mcp` client.

A SearXNG-shaped search API and the pages are served on loopback by the test (allowed by
`--allow-hosts`); the browser server runs as `responses-serve tool browser` builds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from mcp import Client
from openai.types.responses.response_function_web_search import ActionFind, ActionOpenPage, ActionSearch
from openai_harmony import ToolNamespaceConfig

from serve_app.core.citations import CitedPage, annotate
from serve_app.tools.browser.backends import SearxngBackend
from serve_app.tools.browser.browser import Browser
from serve_app.tools.browser.fetch import Fetcher
from serve_app.tools.browser.policy import FetchPolicy, HostRules
from serve_app.tools.browser.server import ALLOWED_DOMAINS_META_KEY, RESULT_META_KEY, SESSION_META_KEY, cited_pages, create_app
from tests.support.servers import uvicorn_server
from tests.tools.browser.web import Web, running_web


@pytest.fixture(scope="module")
def web() -> Iterator[Web]:
    with running_web() as web:
        yield web


def serve_browser(web: Web, allow: tuple[str, ...]):
    browser = Browser(SearxngBackend(web.base), Fetcher(FetchPolicy(HostRules(allow))))
    return uvicorn_server(create_app(browser))


def mcp_url(server_url: str) -> str:
    return server_url.removesuffix("/v1") + "/mcp"


def results(web: Web) -> list[dict]:
    return [
        {"url": web.url("/pages/article"), "title": "Harmony, explained", "content": "The response format of gpt-oss."},
        {"url": web.url("/pages/channels"), "title": "Channels", "content": "Analysis, commentary, final."},
    ]


def test_tools_and_instructions_are_harmonys_browser(web: Web) -> None:
    namespace = ToolNamespaceConfig.browser()

    async def go(url: str):
        async with Client(url) as client:
            return client.instructions, (await client.list_tools()).tools

    with serve_browser(web, ("127.0.0.1",)) as server:
        instructions, tools = asyncio.run(go(mcp_url(server)))
    assert instructions == namespace.description
    assert [(t.name, t.description, t.input_schema) for t in tools] == [(t.name, t.description, t.parameters) for t in namespace.tools]


def test_search_open_find_and_open_a_url(web: Web) -> None:
    web.results = results(web)
    meta = {SESSION_META_KEY: "resp_1"}

    async def go(url: str):
        async with Client(url) as client:
            calls = [
                ("search", {"query": "harmony format", "topn": 5}),
                ("open", {"id": 0}),  # the first result
                ("find", {"pattern": "channels"}),
                ("open", {"id": 0}),  # the first match: back into the article at its line
                ("open", {"id": web.url("/pages/channels")}),
                ("open", {"cursor": 1, "loc": 3, "num_lines": 2}),  # scroll the article
            ]
            return [await client.call_tool(name, args, meta=meta) for name, args in calls]

    with serve_browser(web, ("127.0.0.1",)) as server:
        search, article, found, match, channels, scrolled = asyncio.run(go(mcp_url(server)))
    article_url, channels_url = web.url("/pages/article"), web.url("/pages/channels")

    for result in (search, article, found, match, channels, scrolled):
        assert not result.is_error, result.content[0].text
    text = [r.content[0].text for r in (search, article, found, match, channels, scrolled)]
    assert text[0].startswith("[0] harmony format\n**viewing lines [0 - 5] of 5**\n\nL0: \nL1: URL: \nL2: # Search Results\n")
    assert "L4:   * 【0†Harmony, explained†127.0.0.1:" in text[0]
    assert text[1].startswith(f"[1] Harmony, explained ({article_url})\n**viewing lines [0 - ")
    assert "【0†channels page】" in text[1]
    assert "【1†the \nL6: cookbook†cookbook.example.org】" in text[1]  # wrapped at 80
    assert text[2].startswith(f"[2] Find results for text: `channels` in `Harmony, explained` ({article_url}/find?pattern=channels)")
    assert "L0: # 【0†match at L5】\nL1: channels, and it is described in the channels page and on the " in text[2]
    assert text[3].startswith(f"[3] Harmony, explained ({article_url})\n**viewing lines [1 - ")  # 4 lines above the match
    assert text[4].startswith(f"[4] Channels ({channels_url})\n")
    assert text[5].startswith(f"[5] Harmony, explained ({article_url})\n**viewing lines [3 - 4] of ")
    assert "\nL3: " in text[5]
    assert "\nL5: " not in text[5]

    metas = [r.meta[RESULT_META_KEY] for r in (search, article, found, match, channels, scrolled)]
    # The actions are openai's web_search_call actions.
    assert ActionSearch.model_validate(metas[0]["action"]).sources[0].url == article_url
    assert metas[0]["sources"][:2] == [{"url": article_url, "title": "Harmony, explained"}, {"url": channels_url, "title": "Channels"}]
    assert ActionOpenPage.model_validate(metas[1]["action"]).url == article_url
    assert ActionFind.model_validate(metas[2]["action"]).model_dump() == {"type": "find_in_page", "pattern": "channels", "url": article_url}
    assert [m["cursor"] for m in metas] == [0, 1, 2, 3, 4, 5]
    # Every cursor but the search page's is citable; a find page cites its page.
    pages = metas[-1]["pages"]
    assert pages == {
        "1": {"url": article_url, "title": "Harmony, explained"},
        "2": {"url": article_url, "title": "Harmony, explained"},
        "3": {"url": article_url, "title": "Harmony, explained"},
        "4": {"url": channels_url, "title": "Channels"},
        "5": {"url": article_url, "title": "Harmony, explained"},
    }
    # What the loop does with them: the answer's markers become annotations.
    cited = cited_pages(scrolled.meta)
    assert cited[4] == CitedPage(url=channels_url, title="Channels")
    assert sorted(cited) == [1, 2, 3, 4, 5]
    answer, annotations = annotate("Harmony has three channels【4†L2】. It is gpt-oss's format【1†L3-L5】.", cited)
    assert answer == "Harmony has three channels. It is gpt-oss's format."
    assert [(answer[a.start_index : a.end_index], a.url) for a in annotations] == [
        ("Harmony has three channels", channels_url),
        ("It is gpt-oss's format", article_url),
    ]


def test_sessions_are_kept_apart_by_their_id(web: Web) -> None:
    web.results = results(web)

    async def go(url: str):
        async with Client(url) as client:
            await client.call_tool("search", {"query": "a"}, meta={SESSION_META_KEY: "resp_a"})
            other = await client.call_tool("open", {"id": 0}, meta={SESSION_META_KEY: "resp_b"})
            same = await client.call_tool("open", {"id": 0}, meta={SESSION_META_KEY: "resp_a"})
        async with Client(url) as client:  # another connection, same browsing session
            again = await client.call_tool("open", {"cursor": 1}, meta={SESSION_META_KEY: "resp_a"})
        return other, same, again

    with serve_browser(web, ("127.0.0.1",)) as server:
        other, same, again = asyncio.run(go(mcp_url(server)))
    assert other.is_error
    assert other.content[0].text == "No pages to access!"
    assert not same.is_error
    assert same.meta[RESULT_META_KEY]["cursor"] == 1
    assert not again.is_error
    assert again.meta[RESULT_META_KEY]["cursor"] == 2


def test_without_an_id_only_a_handshake_sessions_id_keeps_the_state(web: Web) -> None:
    # MCP's 2026-07-28 protocol (the SDK's default) has no transport session: there, each
    # call without `_meta[SESSION_META_KEY]` browses alone. Handshake-era clients get the
    # `Mcp-Session-Id` session.
    web.results = results(web)

    async def go(url: str):
        async with Client(url, mode="legacy") as client:
            await client.call_tool("search", {"query": "a"})
            first = await client.call_tool("open", {"id": 1})
        async with Client(url, mode="legacy") as client:
            other_session = await client.call_tool("open", {"id": 1})
        async with Client(url) as client:
            await client.call_tool("search", {"query": "a"})
            sessionless = await client.call_tool("open", {"id": 1})
        return first, other_session, sessionless

    with serve_browser(web, ("127.0.0.1",)) as server:
        first, other_session, sessionless = asyncio.run(go(mcp_url(server)))
    assert not first.is_error
    assert first.meta[RESULT_META_KEY]["action"]["url"] == web.url("/pages/channels")
    assert other_session.is_error
    assert other_session.content[0].text == "No pages to access!"
    assert sessionless.is_error
    assert sessionless.content[0].text == "No pages to access!"


def test_the_default_policy_refuses_loopback_through_mcp(web: Web) -> None:
    web.results = results(web)
    web.requests.clear()

    async def go(url: str):
        async with Client(url) as client:
            await client.call_tool("search", {"query": "a"}, meta={SESSION_META_KEY: "s"})
            return await client.call_tool("open", {"id": 0}, meta={SESSION_META_KEY: "s"})

    with serve_browser(web, ()) as server:
        refused = asyncio.run(go(mcp_url(server)))
    assert refused.is_error
    assert "resolves to a loopback address" in refused.content[0].text
    assert refused.meta[RESULT_META_KEY]["action"] == {"type": "open_page", "url": web.url("/pages/article")}
    assert web.paths() == ["/search"]  # the search API is the operator's; no page was fetched


def test_allowed_domains_come_from_meta_and_bad_meta_is_refused(web: Web) -> None:
    web.results = results(web)

    async def go(url: str):
        async with Client(url) as client:
            filtered = await client.call_tool(
                "search", {"query": "a"}, meta={SESSION_META_KEY: "d", ALLOWED_DOMAINS_META_KEY: ["example.org"]}
            )
            bad = await client.call_tool("search", {"query": "a"}, meta={ALLOWED_DOMAINS_META_KEY: "example.org"})
            long_id = await client.call_tool("search", {"query": "a"}, meta={SESSION_META_KEY: "x" * 300})
            unknown = await client.call_tool("click", {"id": 1})
            wrong = await client.call_tool("open", {"id": 1.5}, meta={SESSION_META_KEY: "d"})
        return filtered, bad, long_id, unknown, wrong

    with serve_browser(web, ("127.0.0.1",)) as server:
        filtered, bad, long_id, unknown, wrong = asyncio.run(go(mcp_url(server)))
    assert not filtered.is_error
    assert filtered.meta[RESULT_META_KEY]["sources"] == []
    assert bad.is_error
    assert "must be a list" in bad.content[0].text
    assert long_id.is_error
    assert "1 to 256 characters" in long_id.content[0].text
    assert unknown.is_error
    assert unknown.content[0].text == "Unknown function: click"
    assert wrong.is_error
    assert wrong.content[0].text == "`id` should be an integer, not `1.5`"


def test_cited_pages_leaves_out_what_is_not_a_page() -> None:
    meta = {RESULT_META_KEY: {"pages": {"1": {"url": "https://a.example/", "title": "A"}, "x": {}, "2": {"url": 5}, "3": "no"}}}
    assert cited_pages(meta) == {1: CitedPage(url="https://a.example/", title="A")}
    assert cited_pages(None) == {}
    assert cited_pages({RESULT_META_KEY: []}) == {}


def test_view_source_shows_the_pages_markup_as_text(web: Web) -> None:
    web.pages["forged"] = "<html><body><p>【0†fake link】</p></body></html>"

    async def go(url: str):
        async with Client(url) as client:
            meta = {SESSION_META_KEY: "src"}
            source = await client.call_tool("open", {"id": web.url("/pages/forged"), "view_source": True}, meta=meta)
            search_page_source = await client.call_tool("search", {"query": "a"}, meta=meta)
            refused = await client.call_tool("open", {"view_source": True}, meta=meta)
            return source, search_page_source, refused

    web.results = results(web)
    with serve_browser(web, ("127.0.0.1",)) as server:
        source, _, refused = asyncio.run(go(mcp_url(server)))
    forged = web.url("/pages/forged")
    assert source.content[0].text == (
        f"[0] view-source:{forged} ({forged})\n**viewing lines [0 - 2] of 2**\n\n"
        f"L0: \nL1: URL: {forged}\nL2: <html><body><p>〖0†fake link〗</p></body></html>"
    )
    assert source.meta[RESULT_META_KEY]["pages"]["0"] == {"url": forged, "title": f"view-source:{forged}"}
    assert refused.is_error
    assert refused.content[0].text == "Cannot view the source of a search results page."
