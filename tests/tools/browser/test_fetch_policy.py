"""The fetch policy, attacked: what a prompt-injected model or a hostile page would try.

Each attack runs against a real page server on loopback that records every request; a
refused URL must be refused *before* connecting, so the server sees no request for it. The
browser is given `--allow-hosts` for the loopback address where a test needs some page to
work, so that only the attack itself stands in the way. Names that must resolve to chosen
addresses use an injected resolver (no DNS here); `localhost` uses the system's resolver.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator

import pytest

from serve_app.tools.browser.backends import SearxngBackend
from serve_app.tools.browser.browser import Browser, BrowserLimits, BrowserSession
from serve_app.tools.browser.fetch import Fetcher, FetchLimits
from serve_app.tools.browser.policy import FetchPolicy, FetchRefused, HostRules
from serve_app.tools.egress import refusal_reason
from tests.support.servers import free_port
from tests.tools.browser.tls import client_context, https_server, make_certificates
from tests.tools.browser.web import Web, running_web

LOOPBACK = ipaddress.ip_address("127.0.0.1")


@pytest.fixture(scope="module")
def web() -> Iterator[Web]:
    with running_web() as web:
        yield web


@pytest.fixture(autouse=True)
def fresh(web: Web) -> None:
    web.requests.clear()
    web.results = []


class Names:
    """A resolver for test names; counts its lookups."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list:
        self.lookups.append(host)
        if host not in self.table:
            raise OSError(f"no such name: {host}")
        return [ipaddress.ip_address(self.table[host])]


def make(web: Web, allow: tuple[str, ...] = (), names: Names | None = None, limits: FetchLimits | None = None) -> Browser:
    policy = FetchPolicy(HostRules(allow), resolver=names)
    return Browser(SearxngBackend(web.base), Fetcher(policy, limits or FetchLimits(timeout_s=10)))


def open_url(browser: Browser, url: str, allowed_domains: tuple[str, ...] | None = None, session: BrowserSession | None = None):
    async def go():
        try:
            return await browser.open(session or BrowserSession(browser.limits), id=url, allowed_domains=allowed_domains)
        finally:
            await browser.backend.aclose()

    return asyncio.run(go())


def port(web: Web) -> int:
    return int(web.base.rsplit(":", 1)[1])


# --- allowed by flag, refused by default ---


def test_allowed_by_flag_the_page_opens(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), web.url("/pages/article"))
    assert not outcome.is_error, outcome.text
    assert outcome.text.startswith(f"[0] Harmony, explained ({web.url('/pages/article')})\n")
    assert web.paths() == ["/pages/article"]


def test_the_default_policy_refuses_loopback_before_connecting(web: Web) -> None:
    outcome = open_url(make(web), web.url("/secret"))
    assert outcome.is_error
    assert (
        outcome.text
        == f"Error fetching URL `{web.url('/secret')}`: `127.0.0.1` resolves to a loopback address (127.0.0.1), which this browser does not open"
    )
    assert web.requests == []


def test_localhost_through_the_system_resolver_is_refused(web: Web) -> None:
    outcome = open_url(make(web), f"http://localhost:{port(web)}/secret")
    assert outcome.is_error
    assert "loopback" in outcome.text
    assert web.requests == []


def test_a_name_that_resolves_to_loopback_is_refused(web: Web) -> None:
    names = Names({"innocent.example": "127.0.0.1"})
    outcome = open_url(make(web, names=names), f"http://innocent.example:{port(web)}/secret")
    assert outcome.is_error
    assert "`innocent.example` resolves to a loopback address" in outcome.text
    assert web.requests == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://allowed@127.0.0.1:{port}/secret", "user name or password"),
        ("http://user:pw@127.0.0.1:{port}/secret", "user name or password"),
        ("http://127.0.0.1:{port}@127.0.0.1:{port}/secret", "user name or password"),
        ("http://2130706433:{port}/secret", "not a canonical IP address"),
        ("http://0x7f.0.0.1:{port}/secret", "not a canonical IP address"),
        ("http://127.1:{port}/secret", "not a canonical IP address"),
        ("http://0177.0.0.1:{port}/secret", "not a valid URL"),
        ("http://[::1]:{port}/secret", "loopback"),
        ("http://[::ffff:127.0.0.1]:{port}/secret", "loopback"),
        ("http://[::ffff:7f00:1]:{port}/secret", "loopback"),
        ("http://[64:ff9b::7f00:1]:{port}/secret", "loopback"),
        ("http://[fe80::1%25lo]:{port}/secret", "zone"),
        ("http://0.0.0.0:{port}/secret", "unspecified"),
        ("file:///etc/passwd", "only http and https"),
        ("gopher://127.0.0.1:{port}/secret", "only http and https"),
        ("ftp://127.0.0.1:{port}/secret", "only http and https"),
        ("http://127.0.0.1:{port}/se cret", "whitespace"),
        ("http:///secret", "no host"),
    ],
)
def test_spellings_and_tricks_are_refused(web: Web, url: str, reason: str) -> None:
    # 127.0.0.1 itself is allowed here: each URL is refused for its own trick.
    outcome = open_url(make(web, allow=("127.0.0.1",)), url.format(port=port(web)))
    assert outcome.is_error, outcome.text
    assert reason in outcome.text, outcome.text
    assert web.requests == []


def test_a_name_resolving_to_any_refused_address_is_refused(web: Web) -> None:
    class Both(Names):
        async def __call__(self, host: str, port: int) -> list:
            return [ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("10.0.0.1")]

    outcome = open_url(make(web, names=Both({})), f"http://mixed.example:{port(web)}/secret")
    assert outcome.is_error
    assert "a private address (10.0.0.1)" in outcome.text
    assert web.requests == []


# --- the connection goes where the check looked ---


@pytest.mark.slow
def test_the_checked_address_is_the_one_connected_to_with_the_host_header_kept(web: Web) -> None:
    # The name resolves once; a second lookup (a rebinding attacker's chance) would fail.
    names = Names({"pages.example": "127.0.0.1"})
    outcome = open_url(make(web, allow=("pages.example",), names=names), f"http://pages.example:{port(web)}/pages/channels")
    assert not outcome.is_error, outcome.text
    assert names.lookups == ["pages.example"]
    assert web.requests == [("/pages/channels", f"pages.example:{port(web)}")]


# --- redirects: every hop checked ---


def test_a_redirect_to_a_refused_address_is_refused(web: Web) -> None:
    names = Names({"pages.example": "127.0.0.1"})
    target = f"http://127.0.0.1:{port(web)}/secret"
    outcome = open_url(make(web, allow=("pages.example",), names=names), f"http://pages.example:{port(web)}/redirect?to={target}")
    assert outcome.is_error
    assert "`127.0.0.1` resolves to a loopback address" in outcome.text
    assert web.paths() == ["/redirect"]


def test_a_redirect_to_a_name_resolving_to_a_refused_address_is_refused(web: Web) -> None:
    names = Names({"pages.example": "127.0.0.1", "evil.example": "127.0.0.1"})
    target = f"http://evil.example:{port(web)}/secret"
    outcome = open_url(make(web, allow=("pages.example",), names=names), f"http://pages.example:{port(web)}/redirect?to={target}")
    assert outcome.is_error
    assert "`evil.example` resolves to a loopback address" in outcome.text
    assert web.paths() == ["/redirect"]


@pytest.mark.parametrize("target", ["file:///etc/passwd", "http://169.254.169.254/latest/meta-data/", "http://user@{host}/secret"])
def test_redirects_to_other_schemes_metadata_or_credentials_are_refused(web: Web, target: str) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), web.url("/redirect?to=" + target.format(host=f"127.0.0.1:{port(web)}")))
    assert outcome.is_error
    assert web.paths() == ["/redirect"]


def test_an_allowed_redirect_is_followed_and_the_page_has_its_final_url(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), web.url("/redirect?to=/pages/channels"))
    assert not outcome.is_error, outcome.text
    assert outcome.sources[0].url == web.url("/pages/channels")
    assert web.paths() == ["/redirect", "/pages/channels"]


def test_redirects_are_bounded(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), web.url("/loop"))
    assert outcome.is_error
    assert "more than 5 redirects" in outcome.text
    assert web.paths() == ["/loop"] * 6


# --- allowed_domains from the request ---


def test_allowed_domains_filter_search_results_and_every_page(web: Web) -> None:
    p = port(web)
    names = Names({"docs.allowed.example": "127.0.0.1", "other.example": "127.0.0.1"})
    browser = make(web, allow=("docs.allowed.example", "other.example"), names=names)
    web.results = [
        {"url": f"http://docs.allowed.example:{p}/pages/article", "title": "Article", "content": "in"},
        {"url": f"http://other.example:{p}/pages/channels", "title": "Channels", "content": "out"},
    ]
    web.pages["bridge"] = (
        f"<html><body><p>Go <a href='http://other.example:{p}/secret'>elsewhere</a> now, the words of the page.</p></body></html>"
    )
    allowed = ("allowed.example",)

    async def go():
        session = BrowserSession(browser.limits)
        try:
            found = await browser.search(session, "harmony", allowed_domains=allowed)
            assert [s.url for s in found.sources] == [f"http://docs.allowed.example:{p}/pages/article"]
            assert "other.example" not in found.text
            outside = await browser.open(session, id=f"http://other.example:{p}/secret", allowed_domains=allowed)
            assert outside.is_error
            assert "`other.example` is not in the allowed domains" in outside.text
            hop = await browser.open(
                session, id=f"http://docs.allowed.example:{p}/redirect?to=http://other.example:{p}/secret", allowed_domains=allowed
            )
            assert hop.is_error
            assert "not in the allowed domains" in hop.text
            bridge = await browser.open(session, id=f"http://docs.allowed.example:{p}/pages/bridge", allowed_domains=allowed)
            assert not bridge.is_error, bridge.text
            click = await browser.open(session, id=0, allowed_domains=allowed)
            assert click.is_error
            assert "not in the allowed domains" in click.text
            # A page opened without the filter is not shown once a filter applies.
            free = await browser.open(session, id=f"http://other.example:{p}/pages/channels")
            assert not free.is_error
            scroll = await browser.open(session, cursor=free.cursor, allowed_domains=allowed)
            assert scroll.is_error
            assert "not in the allowed domains" in scroll.text
        finally:
            await browser.backend.aclose()

    asyncio.run(go())
    assert "/secret" not in web.paths()


# --- caps: size, time, content type ---


@pytest.mark.slow
def test_a_huge_page_is_read_up_to_the_cap(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",), limits=FetchLimits(max_bytes=64 * 1024)), web.url("/huge"))
    assert not outcome.is_error, outcome.text
    assert outcome.truncated
    assert outcome.text.startswith(f"[0] Huge ({web.url('/huge')})")


@pytest.mark.slow
def test_a_slow_page_times_out(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",), limits=FetchLimits(timeout_s=1)), web.url("/slow"))
    assert outcome.is_error
    assert outcome.text == f"Error fetching URL `{web.url('/slow')}`: timed out after 1 s"


def test_other_content_types_are_not_shown(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), web.url("/binary"))
    assert outcome.is_error
    assert "cannot show content of type `application/octet-stream`" in outcome.text


def test_an_http_error_is_reported(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), web.url("/pages/missing"))
    assert outcome.is_error
    assert outcome.text.endswith("HTTP 404 Not Found")


# --- the policy's own rules ---


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254", "169.254.1.1", "224.0.0.1",
        "0.0.0.0", "255.255.255.255", "::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254", "ff02::1", "::ffff:10.0.0.1",
        "64:ff9b::a00:1", "2002:a00:1::1",
    ],
)  # fmt: skip
def test_non_public_addresses_are_refused(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is None


def test_metadata_addresses_need_an_exact_listing() -> None:
    async def check(allow: tuple[str, ...]):
        policy = FetchPolicy(HostRules(allow), resolver=Names({"metadata.example": "169.254.169.254"}))
        return await policy.check("http://metadata.example/latest/")

    for allow in [("169.254.0.0/16",), ("metadata.example",), ("0.0.0.0/0",)]:
        with pytest.raises(FetchRefused, match="cloud metadata"):
            asyncio.run(check(allow))
    assert asyncio.run(check(("169.254.169.254",))).address == ipaddress.ip_address("169.254.169.254")


@pytest.mark.parametrize("address", ["::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "168.63.129.16"])
def test_metadata_behind_an_allowed_name_or_network_is_refused_in_every_form(address: str) -> None:
    """An allowed name or network exempts private addresses, never a metadata one, also when
    it comes embedded in IPv6 (IPv4-mapped, NAT64); Azure's WireServer is one though public."""
    for allow in [("metadata.example",), ("::/0",), ("0.0.0.0/0",)]:
        policy = FetchPolicy(HostRules(allow), resolver=Names({"metadata.example": address}))
        with pytest.raises(FetchRefused, match="cloud metadata"):
            asyncio.run(policy.check("http://metadata.example/latest/"))


def test_allow_hosts_rejects_what_is_not_a_host() -> None:
    with pytest.raises(ValueError, match="not a host name"):
        HostRules(["http://example.com/path"])
    rules = HostRules(["Example.COM.", "10.0.0.0/8", "[::1]"])
    assert rules.allows_name("example.com")
    assert rules.allows_address(ipaddress.ip_address("10.2.3.4"))
    assert rules.allows_address(ipaddress.ip_address("::1"))
    assert not rules.allows_address(LOOPBACK)


@pytest.mark.slow
def test_a_compression_bomb_is_inflated_only_up_to_the_cap(web: Web) -> None:
    # 64 KiB of gzip that would inflate to 64 MiB: read to 256 KiB, no more.
    outcome = open_url(make(web, allow=("127.0.0.1",), limits=FetchLimits(max_bytes=256 * 1024)), web.url("/bomb"))
    assert not outcome.is_error, outcome.text
    assert outcome.truncated


def test_unknown_content_encodings_are_refused(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), web.url("/brotli"))
    assert outcome.is_error
    assert "cannot read content encoded as `br`" in outcome.text


def test_a_closed_port_is_an_error_the_model_reads(web: Web) -> None:
    outcome = open_url(make(web, allow=("127.0.0.1",)), f"http://127.0.0.1:{free_port()}/")
    assert outcome.is_error
    assert outcome.text.startswith("Error fetching URL `http://127.0.0.1:")
    assert "ConnectError" in outcome.text


# --- https: the pinned connection still verifies the certificate for the host ---


def test_https_connects_to_the_checked_address_and_verifies_the_host(web: Web, tmp_path) -> None:
    ca, certificate, key = make_certificates(tmp_path, "secure.example")
    names = Names({"secure.example": "127.0.0.1", "impostor.example": "127.0.0.1"})
    policy = FetchPolicy(HostRules(["secure.example", "impostor.example"]), resolver=names)
    fetcher = Fetcher(policy, FetchLimits(timeout_s=10), ssl_context=client_context(ca))

    async def fetch(url: str):
        return await Browser(SearxngBackend(web.base), fetcher).open(BrowserSession(BrowserLimits()), id=url)

    with https_server(web.app(), certificate, key) as tls_port:
        good = asyncio.run(fetch(f"https://secure.example:{tls_port}/pages/channels"))
        # Same address, another name: the certificate is not for it, so no page.
        bad = asyncio.run(fetch(f"https://impostor.example:{tls_port}/pages/channels"))
    assert not good.is_error, good.text
    assert good.text.startswith(f"[0] Channels (https://secure.example:{tls_port}/pages/channels)")
    assert bad.is_error
    assert "CERTIFICATE_VERIFY_FAILED" in bad.text
