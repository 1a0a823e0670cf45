"""The RayService manifests: valid against KubeRay's CRD schema and in step with the configs."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_app.config import AppConfig
from tests.k8s.manifests import MINIO, PGVECTOR, rayservice, runs_ingress, service_address

pytestmark = pytest.mark.slow  # sandboxes, servers or schemas that take seconds to start: not in make test-fast

ROOT = Path(__file__).parents[2]
MANIFESTS = sorted((ROOT / "k8s").glob("*.yaml"))  # RayServices, each followed by its NetworkPolicies
# KubeRay's CRD (data for development and CI only; the product never reads it): shared/ beside
# the repository (a clone, CI) or beside the folder of work trees (/work/wt/<name>).
CRD = next(
    (c for c in (base / "shared" / "kuberay" / "ray.io_rayservices.yaml" for base in (ROOT.parent, ROOT.parent.parent)) if c.is_file()),
    ROOT.parent / "shared" / "kuberay" / "ray.io_rayservices.yaml",
)
# Each manifest serves one config file's applications.
SERVES = {"rayservice-gpt-oss-20b.yaml": "gpt-oss-20b.yaml", "rayservice-gpt-oss-120b.yaml": "gpt-oss-120b.yaml"}
# The Ray node label of the CPU nodes (head, CPU workers), which the ingress selects.
CPU_NODE_LABEL = {"responses-serve/node": "cpu"}


@pytest.fixture(scope="module")
def rayservice_schema() -> dict:
    if not CRD.is_file():
        pytest.skip(f"{CRD} is not here")
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_a_valid_rayservice(path, rayservice_schema):
    manifest = rayservice(path)
    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] == "RayService"
    jsonschema.validate(manifest, rayservice_schema)
    serve_config = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    for application in serve_config.applications:
        AppConfig.model_validate(application.args)
    # No engine on the head: it advertises no GPUs.
    assert manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"


def test_every_manifest_serves_a_config():
    assert sorted(p.name for p in MANIFESTS) == sorted(SERVES)


def _ingress_label_selector(application: dict) -> dict:
    return application["args"]["ingress"]["ray_actor_options"]["label_selector"]


@pytest.mark.parametrize("name", sorted(SERVES))
def test_rayservice_serves_its_config(name):
    """The config file's applications, plus what only this cluster has: the ingress held to
    CPU nodes (a single machine's `serve run` has no node labels), the store in Redis (the
    config's one-line switch from its embedded default: k8s/store/, which survives restarts),
    the store's password read from a variable of its own (KubeRay sets REDIS_PASSWORD on the
    head to the GCS's), API keys (a public endpoint is not open), uploaded files in the MinIO and
    vector stores in the PostgreSQL of k8s/store/ (tests/k8s/test_k8s_retrieval.py), and the
    built-in tools at the Services of k8s/tools/."""
    manifest = rayservice(ROOT / "k8s" / name)
    config = yaml.safe_load((ROOT / "serve_app" / "configs" / SERVES[name]).read_text())
    applications = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    for application in applications:
        assert _ingress_label_selector(application) == CPU_NODE_LABEL
        del application["args"]["ingress"]["ray_actor_options"]["label_selector"]
        assert application["args"].pop("tools") == {"builtin": _tool_services()}
        assert application["args"]["store"]["type"] == "redis"
        application["args"]["store"]["type"] = "embedded"
        assert application["args"]["store"].pop("password_env") != "REDIS_PASSWORD"
        assert application["args"].pop("auth")["keys"]  # API keys (tests/k8s/test_k8s_security.py)
        assert application["args"].pop("files")["blob"]["endpoint"] == service_address(MINIO)
        stores = application["args"].pop("vector_stores")
        assert urlsplit(stores["url"]).hostname == service_address(PGVECTOR).split(":")[0]
        served = next(a for a in config["applications"] if a["name"] == application["name"])["args"].pop("vector_stores", None)
        if served is not None:  # the config's embedding model, whichever index keeps the vectors
            assert stores["embedding"] == served["embedding"]
    assert applications == config["applications"]


def _tool_services() -> dict:
    """The built-in tools at their Services (k8s/tools/*.yaml): name, port, MCP path."""
    tools = {}
    for tool in ("python", "browser"):
        documents = list(yaml.safe_load_all((ROOT / "k8s" / "tools" / f"{tool}.yaml").read_text()))
        (service,) = [d for d in documents if d["kind"] == "Service"]
        (port,) = service["spec"]["ports"]
        (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["command"][:3] == ["responses-serve", "tool", tool]
        assert str(port["port"]) in container["command"]
        tools[tool] = {"url": f"http://{service['metadata']['name']}:{port['port']}/mcp"}
    return tools


def _app_config(manifest: dict) -> AppConfig:
    (application,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    return AppConfig.model_validate(application["args"])


def _groups(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_ingress_lands_on_cpu_nodes_only(path):
    """The Ray node labels (KubeRay's group `labels`) that the ingress selects: on the head
    and the CPU workers, never on a group that has GPUs."""
    manifest = rayservice(path)
    (application,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    selector = _ingress_label_selector(application)
    for group in _groups(manifest):
        (container,) = group["template"]["spec"]["containers"]
        has_gpus = "nvidia.com/gpu" in container["resources"].get("limits", {})
        selected = selector.items() <= group.get("labels", {}).items()
        assert selected != has_gpus, group.get("groupName", "head")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_pod_templates_are_valid_kubernetes(path):
    """The pods KubeRay makes from each group's template, against Kubernetes' own schema."""
    for group in _groups(rayservice(path)):
        document = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "ray-pod"}, "template": group["template"]}
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_cluster_keeps_its_own_gcs_state(path):
    """KubeRay names each cluster's GCS keys itself: an upgrade's new cluster must not share
    them. (Where the GCS state lives and as whom: tests/k8s/test_k8s_store.py.)"""
    options = rayservice(path)["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert "externalStorageNamespace" not in options


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_pods_and_upgrades_outlast_the_longest_stream(path):
    """Serve's drain of the ingress and engines, Kubernetes' grace period of the worker pods and
    the old cluster's life after an upgrade are all at least the app's maximum stream duration."""
    manifest = rayservice(path)
    (application,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    config = AppConfig.model_validate(application["args"])
    longest = config.max_stream_duration_s
    drains = [config.ingress.serve_options()["graceful_shutdown_timeout_s"]]
    drains += [model.engine.serve_options()["graceful_shutdown_timeout_s"] for model in config.models]
    assert all(drain >= longest for drain in drains)
    for group in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        assert group["template"]["spec"]["terminationGracePeriodSeconds"] >= max(drains)
    assert manifest["spec"]["rayClusterDeletionDelaySeconds"] >= max(drains)
    assert manifest["spec"]["upgradeStrategy"]["type"] == "NewCluster"  # zero-downtime upgrades


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_probes_and_secrets(path):
    manifest = rayservice(path)
    keys = {
        "name": "RESPONSES_SERVE_REASONING_KEYS",
        "valueFrom": {"secretKeyRef": {"name": "responses-serve-reasoning-keys", "key": "keys"}},
    }
    for group in _groups(manifest):
        (container,) = group["template"]["spec"]["containers"]
        # Every ingress replica seals and opens reasoning with the same keys; no other pod has them.
        assert (keys in container["env"]) == runs_ingress(manifest, group)
        assert "livenessProbe" not in container  # KubeRay's (raylet only): no restarts for a slow model
    for group in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        (container,) = group["template"]["spec"]["containers"]
        probe = " ".join(container["readinessProbe"]["exec"]["command"])
        # KubeRay's own checks (raylet, Serve proxy), and our app's readiness through the proxy
        # (every model has a running engine replica), not its liveness (/health).
        for url in ("localhost:52365/api/local_raylet_healthz", "localhost:8000/-/healthz", "localhost:8000/ready"):
            assert url in probe
        assert "/health " not in probe + " "


def test_gpt_oss_120b_pods_hold_one_tensor_parallel_engine():
    manifest = rayservice(ROOT / "k8s" / "rayservice-gpt-oss-120b.yaml")
    (application,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    (model,) = AppConfig.model_validate(application["args"]).models
    assert model.backend.tensor_parallel_size == 4
    (gpu,) = [g for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "gpu"]
    (container,) = gpu["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == model.backend.world_size


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_the_cluster_wide_serve_settings_are_the_same_for_responses_serve_run_and_kuberay(path):
    """deployments/builder.py CLUSTER_ENV (read by the Serve controller, on the head): the head
    container sets each of them as `responses-serve run` starts its cluster (`cluster_env`), and
    `make serve` is that command."""
    import re

    from serve_app.config.cluster import CLUSTER_ENV, cluster_env

    manifest = rayservice(path)
    (head,) = _groups(manifest)[0]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in head["env"]}
    launched = cluster_env({})  # nothing exported: the command's own settings
    assert CLUSTER_ENV  # something to check
    for name, value in CLUSTER_ENV.items():
        assert env[name] == value == launched[name]
    makefile = (ROOT / "Makefile").read_text()
    (config,) = re.findall(r"^serve:.*\n\t.*responses-serve run (\S+)$", makefile, re.M)
    variables = dict(re.findall(r"^(\w+) \?= (\S+)$", makefile, re.M))
    assert re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], config) == "serve_app/configs/demo.yaml"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_pod_runs_serves_haproxy_ingress(path):
    """Serve's settings are read by the processes of each Ray node: every container, workers
    included, turns on the HAProxy ingress as the head does (an ingress replica serves HTTP
    on a port of its own only where its node's processes see it), and names our HAProxy."""
    from serve_app.config import SHUTDOWN_MARGIN_S
    from serve_app.config.cluster import CLUSTER_ENV, HAPROXY_COMMAND, HAPROXY_HARD_STOP_AFTER

    manifest = rayservice(path)
    for group in _groups(manifest):
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == CLUSTER_ENV["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in env  # HAProxy turns it on itself
        assert env["RAY_SERVE_HAPROXY_BINARY_PATH"].endswith(f"/bin/{HAPROXY_COMMAND}")  # no splicing
        # Each node's HAProxy keeps a stream across its reloads (scaling) as long as it may last.
        assert env[HAPROXY_HARD_STOP_AFTER] == CLUSTER_ENV[HAPROXY_HARD_STOP_AFTER]
        assert float(env[HAPROXY_HARD_STOP_AFTER]) >= _app_config(manifest).max_stream_duration_s + SHUTDOWN_MARGIN_S
