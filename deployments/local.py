"""Serve the app in-process with uvicorn and no Ray: `python -m deployments.local`.

For debugging and as the no-Ray baseline of the benchmarks; production runs under Ray Serve.
Serves both scripted models, `gpt-oss-replay` and `qwen3-replay`, built from their configs
as Serve replicas build them.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from deployments.backends import make_backend
from deployments.ingress import model_family
from serve_app.api import ServedModel, create_app
from serve_app.config import ModelConfig


def replay_models(step_delay_ms: float = 0.0) -> list[ServedModel]:
    qwen3 = {
        "family": "chat_template",
        "chat_template": {"template": "qwen3", "reasoning_parser": "qwen3", "tool_parser": "hermes"},
    }
    configs = [
        ModelConfig(name="gpt-oss-replay", backend={"type": "replay", "step_delay_ms": step_delay_ms}),
        ModelConfig(name="qwen3-replay", backend={"type": "replay", "script": "qwen3", "step_delay_ms": step_delay_ms}, **qwen3),
    ]
    return [ServedModel(m.name, make_backend(m.backend), m.max_model_len, model_family(m)) for m in configs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--step-delay-ms", type=float, default=0.0, help="replay: delay per engine step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(replay_models(args.step_delay_ms)), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
