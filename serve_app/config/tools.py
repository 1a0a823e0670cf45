"""Server-side tools: remote MCP servers and the built-in python and browser tools."""

from __future__ import annotations

import urllib.parse
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serve_app.config.base import Strict
from serve_app.config.models import DeploymentConfig


class McpConfig(Strict):
    """Remote MCP servers named by requests (`{"type": "mcp", "server_url": ...}`): none unless
    allowed here. The server connects to them with the request's headers, from inside your
    network: allow only what clients may reach through it (docs/tools.md)."""

    allowed_urls: list[str] = Field(
        default_factory=list,
        description="patterns a request's server_url must match, e.g. https://mcp.example.com/* (none: request MCP servers refused); "
        "a loopback or private address is reached only when a pattern names it literally",
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="connecting to a server and listing its tools")
    call_timeout_s: float = Field(60.0, gt=0, description="one tool call")
    max_output_bytes: int = Field(
        1024 * 1024, ge=1024, description="a tool's output beyond this is cut; a message from a server beyond it fails the call"
    )

    @field_validator("allowed_urls")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        from serve_app.api.url_patterns import UrlPattern

        for pattern in patterns:
            UrlPattern.parse(pattern)
        return patterns


# -- the built-in tools (serve_app/tools/builtin/; docs/tools.md) ----------------------

MiB = 1024 * 1024


class SandboxLimits(BaseModel):
    """Limits of one interpreter of the python tool (its processes, its cells, its files):
    serve_app/tools/python/sandbox.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(30.0, gt=0, description="wall-clock time of one call")
    memory_mb: int = Field(1024, gt=0, description="address space of each process (RLIMIT_AS), and memory of all together (PSS)")
    cpu_s: int = Field(300, gt=0, description="CPU seconds of each process over its life (RLIMIT_CPU)")
    max_processes: int = Field(32, gt=1, description="processes and threads of the sandbox (RLIMIT_NPROC)")
    max_open_files: int = Field(256, ge=16, description="open files of each process (RLIMIT_NOFILE)")
    max_file_mb: int = Field(64, gt=0, description="size of one written file (RLIMIT_FSIZE)")
    disk_mb: int = Field(128, gt=0, description="size of each tmpfs: /mnt/data, /tmp, /dev/shm")
    max_output_bytes: int = Field(65536, gt=0, description="output of one call kept; the rest is dropped")
    max_images: int = Field(8, ge=0, description="matplotlib figures returned per call")
    max_image_bytes: int = Field(2 * MiB, gt=0, description="size of one returned PNG")
    interrupt_grace_s: float = Field(2.0, gt=0, description="time a timed-out cell gets to stop when interrupted")
    start_timeout_s: float = Field(30.0, gt=0, description="time an interpreter gets to start")

    @property
    def footprint_mb(self) -> int:
        """The memory one sandbox can hold at rest: its processes' (`memory_mb`) and its three tmpfs,
        which are RAM (`3 × disk_mb`)."""
        return self.memory_mb + 3 * self.disk_mb

    def rlimits(self) -> dict[str, tuple[int, int]]:
        return {
            "RLIMIT_AS": (self.memory_mb * MiB, self.memory_mb * MiB),
            "RLIMIT_CPU": (self.cpu_s, self.cpu_s + 1),  # SIGXCPU, then SIGKILL a second later
            "RLIMIT_NPROC": (self.max_processes, self.max_processes),
            "RLIMIT_FSIZE": (self.max_file_mb * MiB, self.max_file_mb * MiB),
            "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
            "RLIMIT_CORE": (0, 0),
        }


# The memory of the python tool's pod (k8s/tools/python.yaml: 8 GiB) less what its server takes
# besides the sandboxes (the Python server, bwrap's processes, the 16 MiB /tmp of the pod).
SERVER_RESERVE_MB = 1024


class ContainerLimits(BaseModel):
    """How many containers of the python tool, for how long (tools/python/containers.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_budget_mb: int = Field(
        8 * 1024 - SERVER_RESERVE_MB,
        gt=0,
        description="memory the sandboxes of the server may hold together: it holds "
        "memory_budget_mb // (memory_mb + 3 × disk_mb) containers (5 with the defaults); "
        "its memory limit less 1 GiB for the server itself",
    )
    ttl_s: float = Field(1200.0, gt=0, description="a container is removed this long after its last use")
    max_code_bytes: int = Field(1024 * 1024, gt=0, description="size of the code of one call")

    def max_containers(self, sandbox: SandboxLimits) -> int:
        """How many sandboxes of these limits the memory budget holds (0: not one)."""
        return self.memory_budget_mb // sandbox.footprint_mb


def _tool_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the tool's URL must be an http(s) URL of its MCP endpoint, e.g. http://python-tool:8080/mcp")
    return url


class EmbeddedPythonConfig(SandboxLimits, ContainerLimits):
    """The python tool run by the app, as a Serve deployment of its own (CPU): each sandbox's
    limits (`SandboxLimits`) and the containers' (`ContainerLimits`), per replica."""

    python: str | None = Field(None, description="the interpreter the sandboxes run (its prefix is bound read-only); none: the replica's")
    seccomp: bool = Field(True, description="load the sandbox's seccomp filter (needs libseccomp; fails closed without it)")
    sandbox_uid: int = Field(65534, ge=1, description="host uid of the sandboxes when the replica runs as root")
    deployment: DeploymentConfig = Field(
        default_factory=lambda: DeploymentConfig(num_replicas=1, max_ongoing_requests=64),
        description="Serve options of its deployment; a response's calls reach the replica that holds its container",
    )


class PythonToolConfig(Strict):
    """`code_interpreter`: gpt-oss's python tool, `embedded` in the app or at the `url` of a
    `responses-serve tool python` server (k8s/tools/python.yaml)."""

    embedded: EmbeddedPythonConfig | None = Field(None, description="run it as a deployment of this app")
    url: str | None = Field(None, description="the MCP endpoint of a standalone python tool server, e.g. http://python-tool:8080/mcp")
    timeout_s: float | None = Field(
        None, gt=0, description="with url: the server's --timeout-s, 30 if not given (the model is told it; a call may take it plus 30 s)"
    )
    ttl_s: float | None = Field(
        None, gt=0, description="with url: the server's --ttl-s, 1200 if not given (a container is kept for its tenant this long after use)"
    )

    @model_validator(mode="after")
    def _one_form(self) -> PythonToolConfig:
        if (self.embedded is None) == (self.url is None):
            raise ValueError("give either embedded: {...} or url: http://.../mcp")
        if self.url is not None:
            _tool_url(self.url)
        elif self.timeout_s is not None or self.ttl_s is not None:
            raise ValueError(
                "timeout_s and ttl_s describe a server at url; the embedded tool has its own (embedded.timeout_s, embedded.ttl_s)"
            )
        return self

    @property
    def call_timeout_s(self) -> float:
        if self.embedded is not None:
            return self.embedded.timeout_s
        return self.timeout_s if self.timeout_s is not None else SandboxLimits.model_fields["timeout_s"].default

    @property
    def container_ttl_s(self) -> float:
        if self.embedded is not None:
            return self.embedded.ttl_s
        return self.ttl_s if self.ttl_s is not None else ContainerLimits.model_fields["ttl_s"].default


# The memory of the browser's pod (k8s/tools/browser.yaml: 4 GiB) less what its server takes
# besides the sessions' pages: ~200 MiB at rest (the view's tokenizer), ~10 MiB at the peak of
# parsing a 1 MiB page (about 80 such at once).
BROWSER_RESERVE_MB = 1024


class EmbeddedBrowserConfig(Strict):
    """The browser run by the app, as a Serve deployment of its own (CPU); the options of
    `responses-serve tool browser` (docs/tools-browser.md)."""

    search_url: str | None = Field(
        None, description="the search service: a SearXNG base URL (required for searxng); for tavily, its API URL"
    )
    search_backend: Literal["searxng", "tavily"] = Field("searxng", description="searxng (self-hosted JSON API) or tavily (hosted)")
    search_api_key_env: str | None = Field(None, description="the environment variable holding a hosted API's key (tavily: TAVILY_API_KEY)")
    allow_hosts: list[str] = Field(
        default_factory=list, description="host names, IP addresses and networks (CIDR) the browser may open although not public"
    )
    fetch_timeout_s: float = Field(15.0, gt=0, description="time for one page: DNS, every redirect and the body")
    max_page_bytes: int = Field(1024 * 1024, ge=1024, description="bytes read of one page")
    max_redirects: int = Field(5, ge=0, description="redirects followed for one page")
    search_timeout_s: float = Field(15.0, gt=0, description="time for one search request")
    max_search_results: int = Field(20, ge=1, description="results one search shows at most")
    view_tokens: int = Field(1024, ge=16, description="tokens of page text in one view (gpt-oss's browser: 1024)")
    max_pages: int = Field(100, ge=1, description="pages (cursors) one response may open")
    max_session_bytes: int = Field(
        32 * MiB, ge=MiB, description="memory the pages one response's browsing keeps may hold (the oldest pages go first)"
    )
    max_sessions: int = Field(1024, ge=1, description="browsing sessions (one per response) a replica keeps")
    memory_budget_mb: int = Field(
        4 * 1024 - BROWSER_RESERVE_MB,
        gt=0,
        description="memory the pages of all sessions may hold together: its memory limit less 1 GiB for the server "
        "itself and the pages being fetched (k8s/tools/browser.yaml: 4 GiB); past it a new session, or a page that "
        "does not fit, is a tool error the model reads",
    )
    session_ttl_s: float = Field(1800.0, gt=0, description="a session is dropped this long after its last call")
    deployment: DeploymentConfig = Field(
        default_factory=lambda: DeploymentConfig(num_replicas=1, max_ongoing_requests=256),
        description="Serve options of its deployment; a response's calls reach the replica that holds its pages",
    )

    @property
    def memory_budget_bytes(self) -> int:
        return self.memory_budget_mb * MiB

    @model_validator(mode="after")
    def _backend(self) -> EmbeddedBrowserConfig:
        if self.memory_budget_bytes < self.max_session_bytes:
            raise ValueError(
                f"memory_budget_mb ({self.memory_budget_mb}) must hold at least one full session (max_session_bytes: {self.max_session_bytes})"
            )
        if self.search_backend == "searxng" and not self.search_url:
            raise ValueError("the searxng backend needs search_url (http://searxng:8080)")
        if self.search_url is not None:
            _tool_url(self.search_url)
        return self


class BrowserToolConfig(Strict):
    """`web_search`: gpt-oss's browser, `embedded` in the app or at the `url` of a
    `responses-serve tool browser` server (k8s/tools/browser.yaml)."""

    embedded: EmbeddedBrowserConfig | None = Field(None, description="run it as a deployment of this app")
    url: str | None = Field(None, description="the MCP endpoint of a standalone browser tool server, e.g. http://browser-tool:8090/mcp")

    @model_validator(mode="after")
    def _one_form(self) -> BrowserToolConfig:
        if (self.embedded is None) == (self.url is None):
            raise ValueError("give either embedded: {...} or url: http://.../mcp")
        if self.url is not None:
            _tool_url(self.url)
        return self


class BuiltinToolsConfig(Strict):
    """gpt-oss's own tools, run by the server inside a response (docs/tools.md). A request
    naming one that is not configured is served without it (`unconfigured`)."""

    python: PythonToolConfig | None = Field(None, description="code_interpreter: the sandboxed python tool")
    browser: BrowserToolConfig | None = Field(None, description="web_search (and web_search_preview): the browser")
    unconfigured: Literal["ignore", "reject"] = Field(
        "ignore",
        description="a request naming a built-in tool that is not configured: ignore (accepted, not offered to the model, left out "
        "of the response's tools and named in its x-unavailable-tools header: Codex sends web_search with every request), "
        "or reject (a 400 naming the config that enables it)",
    )


class ToolsConfig(Strict):
    """Server-side tools: the tool loop runs them inside a response (docs/tools.md)."""

    mcp: McpConfig = Field(
        default_factory=McpConfig, description="remote MCP servers named by requests (refused unless allowed_urls lets them)"
    )
    builtin: BuiltinToolsConfig = Field(
        default_factory=BuiltinToolsConfig, description="gpt-oss's python (code_interpreter) and browser (web_search) tools"
    )
    max_calls_per_response: int = Field(
        64, ge=0, description="server-side tool calls one response may run (a request's max_tool_calls may only lower it)"
    )


# The drain: Serve kills a stopping replica `graceful_shutdown_timeout_s` after it stopped
# taking requests (20 s by default), while LLM streams run for minutes. Unless set, the
# ingress's and engines' budget is the longest stream plus this margin for the rest of the
# replica's shutdown.
