"""The manifests of k8s/, read for the tests: the RayServices and their groups, the Valkey,
MinIO and PostgreSQL, the NetworkPolicies."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
RAYSERVICES = sorted(K8S.glob("rayservice-*.yaml"))
VALKEY = K8S / "store" / "redis.yaml"
MINIO = K8S / "store" / "minio.yaml"  # the Files API's object store
PGVECTOR = K8S / "store" / "pgvector.yaml"  # the vector stores' index
TOOLS = {path.stem: path for path in sorted((K8S / "tools").glob("*.yaml"))}  # the built-in tools' MCP servers
# Opt-in policies (applied on their own), beside the ones every install applies.
OPT_IN = sorted((K8S / "network").glob("*.yaml"))


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def every_document() -> list[tuple[Path, dict]]:
    return [(path, document) for path in sorted(K8S.rglob("*.yaml")) for document in documents(path)]


def rayservice(path: Path) -> dict:
    (service,) = [d for d in documents(path) if d["kind"] == "RayService"]
    return service


def of_kind(path: Path, kind: str) -> list[dict]:
    return [d for d in documents(path) if d["kind"] == kind]


def groups(service: dict) -> list[dict]:
    """The head group first, then the worker groups."""
    cluster = service["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]


def group_name(group: dict) -> str:
    return group.get("groupName", "head")


def ray_container(group: dict) -> dict:
    (container,) = group["template"]["spec"]["containers"]
    return container


def env(container: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def applications(service: dict) -> list[dict]:
    return yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]


def runs_ingress(service: dict, group: dict) -> bool:
    """Whether the ingress's label_selector lets ingress replicas onto this group's nodes."""
    (application,) = applications(service)
    selector = application["args"]["ingress"]["ray_actor_options"]["label_selector"]
    return selector.items() <= group.get("labels", {}).items()


def server_container(path: Path) -> dict:
    """The one container of a store's StatefulSet (MinIO, PostgreSQL)."""
    (statefulset,) = of_kind(path, "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return container


def service_address(path: Path) -> str:
    """host:port of the one Service in a file (in the RayServices' namespace)."""
    (service,) = of_kind(path, "Service")
    (port,) = service["spec"]["ports"]
    return f"{service['metadata']['name']}:{port['port']}"


def valkey_container() -> dict:
    (deployment,) = of_kind(VALKEY, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def ingress_store_settings(path: Path = RAYSERVICES[0]) -> tuple[str, str, str]:
    """How the ingress replicas of a RayService reach the response store: REDIS_URL, the
    Secret holding the password (in the environment variable `store.password_env`) and the
    key prefix."""
    service = rayservice(path)
    (application,) = applications(service)
    store = application["args"]["store"]
    head = env(ray_container(groups(service)[0]))
    secret = head[store["password_env"]]["valueFrom"]["secretKeyRef"]["name"]
    return head["REDIS_URL"]["value"], secret, store["key_prefix"]
