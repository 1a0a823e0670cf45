"""A RayService head pod's life on this machine, for tests/k8s/test_k8s_pod.py: run (inside
its sandbox) as `python -m tests.support.k8s_pod`, with the environment the manifest and
KubeRay give the head container. It starts Ray as KubeRay's `ray start` would (token
authentication, GCS state in the Valkey as its GCS user), deploys the app with the manifest's
store settings, stores a response and reads it back, and prints what it saw as one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def main() -> None:
    import ray
    from ray import serve

    from responses_serve.serve.app import build_app

    app_args = json.loads(sys.argv[1])
    dashboard_port = _free_port()
    # What KubeRay's `ray start --head` gets: the dashboard, the GCS in Redis as
    # --redis-username/--redis-password ($REDIS_USERNAME, $REDIS_PASSWORD), the token from the environment.
    ray.init(
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard_port,
        log_to_driver=False,
        _metrics_export_port=_free_port(),
        _redis_username=os.environ["REDIS_USERNAME"],
        _redis_password=os.environ["REDIS_PASSWORD"],
    )
    seen: dict = {}
    try:
        applications = f"http://127.0.0.1:{dashboard_port}/api/serve/applications/"
        seen["dashboard_without_token"] = _status(applications)
        seen["dashboard_with_wrong_token"] = _status(applications, {"Authorization": "Bearer not-the-token"})
        seen["dashboard_with_token"] = _status(applications, {"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"})
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(app_args), name="responses", route_prefix="/")
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 120
        while True:
            try:
                created = _post(f"{base}/responses", {"model": "gpt-oss-replay", "input": "kept in the store", "store": True})
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        with urllib.request.urlopen(f"{base}/responses/{created['id']}", timeout=30) as response:
            stored = json.load(response)
        seen["created"], seen["stored"] = created, stored
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
