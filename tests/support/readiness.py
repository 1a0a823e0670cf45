"""What a readiness route said while an app started: polled in a thread beside the deploy."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Observation:
    status: int  # of /ready
    body: dict[str, Any]
    # A request for `probe_model` sent while /ready said it was not ready: (status, error code).
    request: tuple[int, str | None] | None = None


@dataclass
class ReadinessLog:
    """Polls `base_url + /ready` until stopped; keeps each answer of ours that differs from the
    one before (HAProxy's and Serve's own answers before the ingress runs are left out). The
    first time `probe_model` is not ready, it also asks that model for a response."""

    base_url: str
    probe_model: str | None = None
    interval_s: float = 0.5
    observations: list[Observation] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ReadinessLog:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not (self.observations and self.observations[-1].status == 200):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.base_url}/ready not 200 after {timeout_s:.0f} s: {self.observations[-1:]}")
            time.sleep(0.1)

    def _run(self) -> None:
        probed = False
        while not self._stop.is_set():
            status, body = _get(f"{self.base_url}/ready")
            if isinstance(body.get("models"), dict) and (not self.observations or self.observations[-1].body != body):
                observation = Observation(status, body)
                state = body["models"].get(self.probe_model, {}).get("status")
                if not probed and state not in (None, "ready"):
                    probed = True
                    observation.request = _ask(self.base_url, self.probe_model)
                self.observations.append(observation)
            self._stop.wait(self.interval_s)


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.loads(error.read())
        except ValueError:
            return error.code, {}
    except (OSError, ValueError):
        return 0, {}


def _ask(base_url: str, model: str | None) -> tuple[int, str | None]:
    body = json.dumps({"model": model, "input": "hi", "max_output_tokens": 4}).encode()
    request = urllib.request.Request(f"{base_url}/v1/responses", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, None
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.loads(error.read())["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return error.code, None
    except OSError:
        return 0, None
