"""The built-in tools run by the app itself (`tools.builtin.*.embedded`): their state made from
the config, once per process that runs them (a Serve replica of deployments/tools.py; the
`responses-serve tool` commands build the same from their options)."""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.config import ContainerLimits, EmbeddedBrowserConfig, EmbeddedPythonConfig, SandboxLimits
from serve_app.tools.browser.backends import SearchBackend, SearxngBackend, TavilyBackend, api_key_from_env
from serve_app.tools.browser.browser import Browser, BrowserLimits
from serve_app.tools.browser.fetch import Fetcher, FetchLimits
from serve_app.tools.browser.page import warm_up
from serve_app.tools.browser.policy import FetchPolicy, HostRules
from serve_app.tools.browser.server import SessionStore
from serve_app.tools.python.containers import ContainerManager
from serve_app.tools.python.sandbox import self_test


def python_limits(config: EmbeddedPythonConfig) -> tuple[SandboxLimits, ContainerLimits]:
    sandbox = SandboxLimits(**{name: getattr(config, name) for name in SandboxLimits.model_fields})
    containers = ContainerLimits(**{name: getattr(config, name) for name in ContainerLimits.model_fields})
    return sandbox, containers


async def start_python(config: EmbeddedPythonConfig) -> ContainerManager:
    """The containers of one process, its sandbox checked first (`SandboxError` if it does not
    work: a tool that cannot sandbox does not serve); close with `aclose_python`."""
    sandbox, containers = python_limits(config)
    manager = await ContainerManager.create(
        sandbox, containers, python=config.python, seccomp=config.seccomp, sandbox_uid=config.sandbox_uid
    )
    await self_test(manager.runtime, sandbox)
    return await manager.__aenter__()


async def aclose_python(manager: ContainerManager) -> None:
    await manager.__aexit__(None, None, None)


@dataclass
class EmbeddedBrowser:
    browser: Browser
    sessions: SessionStore

    async def aclose(self) -> None:
        await self.browser.backend.aclose()


def search_backend(config: EmbeddedBrowserConfig) -> SearchBackend:
    """The configured search service; a hosted one's key from the environment (`ValueError`
    naming the variable when it is not set)."""
    if config.search_backend == "searxng":
        assert config.search_url is not None  # the config requires it
        return SearxngBackend(config.search_url, timeout_s=config.search_timeout_s)
    key = api_key_from_env(config.search_api_key_env or TavilyBackend.DEFAULT_KEY_ENV)
    return TavilyBackend(key, base_url=config.search_url or TavilyBackend.DEFAULT_URL, timeout_s=config.search_timeout_s)


def make_browser(config: EmbeddedBrowserConfig) -> EmbeddedBrowser:
    """The browser of one process, under its fetch policy (`ValueError` for a bad allow-host)."""
    fetcher = Fetcher(
        FetchPolicy(HostRules(config.allow_hosts)),
        FetchLimits(max_bytes=config.max_page_bytes, timeout_s=config.fetch_timeout_s, max_redirects=config.max_redirects),
    )
    limits = BrowserLimits(
        view_tokens=config.view_tokens,
        max_search_results=config.max_search_results,
        max_pages=config.max_pages,
        max_session_bytes=config.max_session_bytes,
    )
    browser = Browser(search_backend(config), fetcher, limits)
    warm_up()  # the view's tokenizer, loaded now rather than in the first call
    sessions = SessionStore(
        browser, max_sessions=config.max_sessions, ttl_s=config.session_ttl_s, memory_budget_bytes=config.memory_budget_bytes
    )
    return EmbeddedBrowser(browser, sessions)
