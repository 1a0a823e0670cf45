"""A RayService head pod's life on this machine, for tests/k8s/test_k8s_pod.py: run (inside
its sandbox) as `python -m tests.support.k8s_pod SETTINGS`, with the environment the manifest
and KubeRay give the head container. It starts Ray as KubeRay's `ray start` would (token
authentication, GCS state in the Valkey as its GCS user), deploys the app with the manifest's
settings (API keys, store), runs a worker's readiness probe, stores a response and reads it
back, and prints what it saw as one JSON line. SETTINGS (JSON): `app` (the application's
args), `probe` (the readiness probe's shell command), `key_env` (a tenant's key variable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _post(url: str, body: dict, key: str | None) -> dict:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def main() -> None:
    import ray
    from ray import serve

    from deployments.builder import build_app
    from serve_app.cli.launch import free_side_ports

    settings = json.loads(sys.argv[1])
    key = os.environ[settings["key_env"]]
    # Free ports below the kernel's ephemeral range: Ray's processes bind port 0 as they start.
    ports = dict(zip(("gcs", "dashboard", "agent", "client", "metrics", "serve"), free_side_ports(6), strict=True))
    # KubeRay's `ray start --head` for this head group (rayStartParams, and the GCS in Redis as
    # --redis-username/--redis-password from $REDIS_USERNAME/$REDIS_PASSWORD), on free ports:
    # this machine's network is shared. The sandbox has a PID namespace of its own, so every Ray
    # process ends with it.
    start = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--num-cpus=2", "--num-gpus=0", "--disable-usage-stats"]
    start += [f"--port={ports['gcs']}", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}"]
    start += [f"--dashboard-agent-listen-port={ports['agent']}", f"--ray-client-server-port={ports['client']}"]
    start += [f"--metrics-export-port={ports['metrics']}", "--redis-username=" + os.environ["REDIS_USERNAME"]]
    start += ["--redis-password=" + os.environ["REDIS_PASSWORD"]]
    subprocess.run(start, check=True, capture_output=True, timeout=180)
    ray.init(address=f"127.0.0.1:{ports['gcs']}", log_to_driver=False)
    dashboard_port = ports["dashboard"]
    seen: dict = {}
    try:
        applications = f"http://127.0.0.1:{dashboard_port}/api/serve/applications/"
        seen["dashboard_without_token"] = _status(applications)
        seen["dashboard_with_wrong_token"] = _status(applications, {"Authorization": "Bearer not-the-token"})
        seen["dashboard_with_token"] = _status(applications, {"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"})
        port = ports["serve"]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        try:
            serve.run(build_app(settings["app"]), name="responses", route_prefix="/")
        except RuntimeError:  # a replica that would not start: its own error, for the failure's message
            for name, deployment in serve.status().applications["responses"].deployments.items():
                print(f"{name}: {deployment.status}: {deployment.message}", file=sys.stderr, flush=True)
            raise
        root, base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/v1"
        # The worker's readiness probe, on this node's ports (KubeRay's agent port, the Serve port).
        probe = settings["probe"].replace("localhost:52365", f"127.0.0.1:{ports['agent']}").replace("localhost:8000", f"127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        while (ready := subprocess.run(["bash", "-c", probe], capture_output=True, timeout=30).returncode) != 0:
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        seen["probe"] = ready
        if ready != 0:  # what each of its checks said, for the failure's message
            seen["probe_parts"] = [
                subprocess.run(["bash", "-c", part.split("|")[0]], capture_output=True, text=True, timeout=30).stdout[:300]
                for part in probe.split("&&")
            ]
        seen["open"] = {path: _status(f"{root}{path}") for path in ("/health", "/ready")}
        seen["without_key"] = {path: _status(f"{root}{path}") for path in ("/v1/models", "/docs", "/openapi.json")}
        created = _post(f"{base}/responses", {"model": "gpt-oss-replay", "input": "kept in the store", "store": True}, key)
        request = urllib.request.Request(f"{base}/responses/{created['id']}", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            stored = json.load(response)
        seen["created"], seen["stored"] = created, stored
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
