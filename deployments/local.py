"""Serve the app in-process with uvicorn and no Ray: `python -m deployments.local`.

For debugging and as the no-Ray baseline of the benchmarks; production runs under Ray Serve.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from deployments.backends.replay import ReplayBackend, ReplayConfig
from serve_app.api import ServedModel, create_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--step-delay-ms", type=float, default=0.0, help="replay: delay per engine step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    backend = ReplayBackend(ReplayConfig(step_delay_s=args.step_delay_ms / 1000))
    uvicorn.run(create_app([ServedModel("gpt-oss-replay", backend)]), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
