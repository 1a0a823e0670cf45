"""k8s/store/: the Redis (Valkey) the RayService uses as its response store, checked against
Kubernetes' own schemas (kubernetes-validate, strict), and wired to the RayService."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

ROOT = Path(__file__).parents[2]
REDIS = ROOT / "k8s" / "store" / "redis.yaml"


def test_redis_manifests_are_valid_kubernetes():
    documents = list(yaml.safe_load_all(REDIS.read_text()))
    assert sorted(d["kind"] for d in documents) == ["Deployment", "Service"]
    for document in documents:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_password_only_from_the_secret_and_the_rayservice_uses_it():
    """No password in git: the server and every Ray pod read it from the same Secret."""
    (deployment,) = [d for d in yaml.safe_load_all(REDIS.read_text()) if d["kind"] == "Deployment"]
    (service,) = [d for d in yaml.safe_load_all(REDIS.read_text()) if d["kind"] == "Service"]
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    secret = {"secretKeyRef": {"name": "responses-serve-redis", "key": "password"}}
    assert {"name": "REDIS_PASSWORD", "valueFrom": secret} in server["env"]
    assert "--requirepass" in server["args"][0]
    rayservice = yaml.safe_load((ROOT / "k8s" / "rayservice-gpt-oss-20b.yaml").read_text())
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["REDIS_PASSWORD"] == {"name": "REDIS_PASSWORD", "valueFrom": secret}
        assert env["REDIS_URL"]["value"] == f"redis://{service['metadata']['name']}:6379/0"
    serve_config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert serve_config["applications"][0]["args"]["store"]["type"] == "redis"
