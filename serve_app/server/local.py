"""Serve the app in-process with uvicorn and no Ray: `python -m serve_app.server.local`.

For debugging and as the no-Ray baseline of the benchmarks; production runs under Ray Serve.
Serves the scripted models, `gpt-oss-replay`, `qwen3-replay` and `qwen3-vl-replay`, built
from their configs as Serve replicas build them.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serve_app.server.app import ServedModel


# The scripted chat-template model, as in demo.yaml (the tests serve it from here too).
QWEN3_REPLAY: dict[str, Any] = {
    "name": "qwen3-replay",
    "family": "chat_template",
    "chat_template": {"template": "qwen3", "reasoning_parser": "qwen3", "tool_parser": "hermes"},
    "backend": {"type": "replay", "script": "qwen3"},
}


# The scripted vision model, as in demo.yaml: it says what images it was shown.
QWEN3_VL_REPLAY: dict[str, Any] = {
    "name": "qwen3-vl-replay",
    "family": "chat_template",
    "chat_template": {"template": "qwen3-vl", "reasoning_parser": "qwen3", "tool_parser": "hermes"},
    "backend": {"type": "replay", "script": "qwen3-vl"},
    "vision": {"max_images": 8, "max_image_bytes": 4 * 1024 * 1024},
}


def replay_models(step_delay_ms: float = 0.0) -> list[ServedModel]:
    # Imported here: the tests read QWEN3_REPLAY without loading the backends.
    from serve_app.config import ModelConfig
    from serve_app.engines import make_backend
    from serve_app.runtime.models import served_model

    configs = [
        ModelConfig(name="gpt-oss-replay", backend={"type": "replay", "step_delay_ms": step_delay_ms}),
        *(
            ModelConfig.model_validate({**config, "backend": {**config["backend"], "step_delay_ms": step_delay_ms}})
            for config in (QWEN3_REPLAY, QWEN3_VL_REPLAY)
        ),
    ]
    return [served_model(m, make_backend(m.backend)) for m in configs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--step-delay-ms", type=float, default=0.0, help="replay: delay per engine step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from serve_app.server.app import create_app
    from serve_app.server.settings import ServerSettings

    app = create_app(replay_models(args.step_delay_ms), ServerSettings(listen_host=args.host))
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
