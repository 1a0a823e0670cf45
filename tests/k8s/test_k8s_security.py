"""Every manifest of k8s/ locked down: a restricted securityContext on every container, Ray
token authentication, no secret in plain text, and NetworkPolicies that leave only the Serve
HTTP port open to anyone outside a RayService's own pods (evaluated offline by
tests/support/netpol.py, whose own semantics are checked first)."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from tests.k8s.manifests import (
    K8S,
    MINIO,
    OPT_IN,
    PGVECTOR,
    RAYSERVICES,
    TOOLS,
    VALKEY,
    applications,
    documents,
    env,
    every_document,
    group_name,
    groups,
    of_kind,
    ray_container,
    rayservice,
    runs_ingress,
)
from tests.support.netpol import Address, Pod, admits, allowed

SERVE_PORT = 8000
# Ray's ports on its pods: dashboard, GCS, Ray client, metrics exporter, dashboard agent,
# runtime env agent, object manager, and a worker port (10002-19999).
RAY_PORTS = [8265, 6379, 10001, 8080, 52365, 8076, 10002, 19999]


def _pod_specs() -> list[tuple[str, dict]]:
    """Every pod template: the RayServices' groups, the Deployments and the StatefulSets."""
    specs = []
    for path, document in every_document():
        if document["kind"] == "RayService":
            specs += [(f"{path.name} {group_name(g)}", g["template"]["spec"]) for g in groups(document)]
        elif document["kind"] in ("Deployment", "StatefulSet"):
            specs.append((f"{path.name} {document['metadata']['name']}", document["spec"]["template"]["spec"]))
    return specs


def _containers() -> list[tuple[str, dict]]:
    """Every container: those of the pod templates, and the autoscaler KubeRay adds to each head
    (its settings are `autoscalerOptions`)."""
    found = [(f"{where} {c['name']}", c) for where, spec in _pod_specs() for c in spec["containers"] + spec.get("initContainers", [])]
    for path in RAYSERVICES:
        cluster = rayservice(path)["spec"]["rayClusterConfig"]
        if cluster.get("enableInTreeAutoscaling"):
            found.append((f"{path.name} autoscaler", cluster["autoscalerOptions"]))
    return found


def test_the_manifests_are_the_ones_checked_here():
    kinds = sorted((path.relative_to(K8S).as_posix(), d["kind"]) for path, d in every_document())
    assert kinds == sorted(
        [(p.name, "RayService") for p in RAYSERVICES]
        + [(p.name, "NetworkPolicy") for p in RAYSERVICES for _ in range(2)]
        + [("store/redis.yaml", kind) for kind in ("Deployment", "Service", "NetworkPolicy")]
        + [(f"store/{store}.yaml", kind) for store in ("minio", "pgvector") for kind in ("StatefulSet", "Service", "NetworkPolicy")]
        + [(f"tools/{tool}.yaml", kind) for tool in ("browser", "python") for kind in ("Deployment", "Service", "NetworkPolicy")]
        + [(p.relative_to(K8S).as_posix(), "NetworkPolicy") for p in OPT_IN]
    )


@pytest.mark.slow
def test_every_object_but_the_rayservices_is_valid_kubernetes():
    """(The RayServices against KubeRay's CRD and their pod templates: tests/k8s/test_k8s.py.)"""
    for _path, document in every_document():
        if document["kind"] != "RayService":
            kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(("where", "container"), _containers(), ids=[w for w, _ in _containers()])
def test_every_container_is_restricted(where, container):
    """Kubernetes' `restricted` Pod Security Standard, and a read-only root filesystem."""
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True
    assert isinstance(context["runAsUser"], int)
    assert context["runAsUser"] > 0
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    assert not context.get("privileged")


@pytest.mark.parametrize(("where", "spec"), _pod_specs(), ids=[w for w, _ in _pod_specs()])
def test_every_pod_is_restricted(where, spec):
    context = spec["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] > 0
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork")
    assert not spec.get("hostPID")
    assert not spec.get("hostIPC")
    # Each container runs as its pod does: one user per pod.
    for container in spec["containers"]:
        assert container["securityContext"]["runAsUser"] == context["runAsUser"]
    # Volumes: only empty directories (no host paths, no other pod's data); a StatefulSet's own
    # data is on its PersistentVolumeClaims (volumeClaimTemplates), not here.
    assert all(set(volume) == {"name", "emptyDir"} for volume in spec.get("volumes", []))


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_ray_writes_only_to_its_empty_dirs(path):
    """What Ray, Serve, HAProxy, the app and vLLM write goes to /tmp (Ray's sessions, sockets,
    logs) and ~/.cache (models, compile caches), each an emptyDir; KubeRay adds /dev/shm.
    tests/k8s/test_k8s_pod.py runs them with exactly these writable."""
    service = rayservice(path)
    for group in groups(service):
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in ray_container(group)["volumeMounts"]}
        assert set(mounts) == {"/tmp", "/home/ray/.cache"}
        assert all("emptyDir" in volume for volume in mounts.values())
    autoscaler = service["spec"]["rayClusterConfig"]["autoscalerOptions"]
    assert [m["mountPath"] for m in autoscaler["volumeMounts"]] == ["/tmp"]
    gpu_env = env(ray_container(groups(service)[1]))
    for cache in ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH"):  # defaults outside ~/.cache
        assert gpu_env[cache]["value"].startswith("/home/ray/.cache/")


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_only_the_head_talks_to_kubernetes(path):
    """The autoscaler on the head needs its service account's token; no worker does."""
    head, *workers = groups(rayservice(path))
    assert head["template"]["spec"].get("automountServiceAccountToken") is not False
    assert all(w["template"]["spec"]["automountServiceAccountToken"] is False for w in workers)
    (deployment,) = of_kind(VALKEY, "Deployment")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    for store in (MINIO, PGVECTOR):
        (statefulset,) = of_kind(store, "StatefulSet")
        assert statefulset["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_ray_token_authentication_is_on(path):
    """KubeRay sets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (from the Secret) on every Ray
    container and authenticates its own dashboard calls with it; no container may override
    either (a literal token would be in plain text, a mode would switch it off)."""
    service = rayservice(path)
    options = service["spec"]["rayClusterConfig"]["authOptions"]
    assert options == {"mode": "token", "secretName": "responses-serve-ray-token"}
    major, minor, *_ = (int(part) for part in service["spec"]["rayClusterConfig"]["rayVersion"].split("."))
    assert (major, minor) >= (2, 52)  # Ray's token authentication
    for _where, container in _containers():
        assert not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(env(container))


_SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|_KEYS?$|API_KEY", re.I)


def _names_a_secret(key: str) -> bool:
    """`redisPassword`, `api_key`, `auth_token`: yes; `num_speculative_tokens`, `key_prefix`: no."""
    words = {w.lower() for w in re.findall(r"[A-Za-z][a-z]*|[A-Z]+(?![a-z])", key)}
    return bool(words & {"password", "passwd", "secret", "token", "credential", "credentials"}) or {"api", "key"} <= words


def _secret_fields(value, path=()):
    """(path, value) of every mapping entry whose key names a secret, anywhere in `value`."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _names_a_secret(key):
                yield (*path, key), item
            yield from _secret_fields(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _secret_fields(item, (*path, index))


def test_what_names_a_secret():
    assert all(map(_names_a_secret, ["redisPassword", "api_key", "auth_token", "secretName", "apiKey", "password_env"]))
    assert not any(map(_names_a_secret, ["num_speculative_tokens", "max_tokens", "key_prefix", "keys", "tokenizer"]))


def test_no_secret_in_plain_text():
    """Secrets only as references to Kubernetes Secrets (which are never in git): no Secret
    object, every secret-named variable from a secretKeyRef, every secret-named field a
    reference or the name of a variable, nothing secret in any serveConfigV2."""
    for _where, container in _containers():
        for name, entry in env(container).items():
            if _SECRET_NAME.search(name):
                assert set(entry) == {"name", "valueFrom"}, name
                assert set(entry["valueFrom"]) == {"secretKeyRef"}, name
    for path, document in every_document():
        assert document["kind"] != "Secret", path
        for field_path, value in _secret_fields(document):
            name = field_path[-1]
            if name in ("secretName", "secretKeyRef", "automountServiceAccountToken") or name.endswith("_env"):
                continue  # a reference, the variable holding the secret, or a switch
            assert isinstance(value, dict), (path.name, field_path)
            assert set(value) == {"valueFrom"}, (path.name, field_path)
        if document["kind"] == "RayService":
            for application in applications(document):
                for field_path, _value in _secret_fields(application):
                    assert field_path[-1].endswith("_env"), (path.name, field_path)  # e.g. store.password_env


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_api_keys_come_from_a_secret_where_the_ingress_runs(path):
    """The server is not open: `auth` names each key's variable, and every pod that may run an
    ingress replica sets it from the Secret responses-serve-api-keys (a replica without it
    refuses to start); no key is in the config itself."""
    service = rayservice(path)
    (application,) = applications(service)
    keys = application["args"]["auth"]["keys"]
    assert keys
    assert all("key_env" in key and "key_sha256" not in key for key in keys)
    for group in groups(service):
        variables = env(ray_container(group))
        for key in keys:
            if runs_ingress(service, group):
                ref = variables[key["key_env"]]["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "responses-serve-api-keys", key
            else:
                assert key["key_env"] not in variables


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_credentials_only_where_the_ingress_runs(path):
    """The store's password and the reasoning keys (and the API keys) live on the pods where
    ingress replicas may run; GPU pods, which hold only engines, have no Secret at all."""
    service = rayservice(path)
    for group in groups(service):
        refs = [e for e in env(ray_container(group)).values() if "valueFrom" in e]
        if not runs_ingress(service, group):
            assert refs == [], group_name(group)


# -- NetworkPolicies --------------------------------------------------------------------------


def _labels(path) -> dict[str, str]:
    """The pod labels of a RayService's groups (the same on every group)."""
    (labels,) = {tuple(sorted(g["template"]["metadata"]["labels"].items())) for g in groups(rayservice(path))}
    return dict(labels)


def _ray_pod(path) -> Pod:
    return Pod(_labels(path), ports={"metrics": 8080, "dashboard": 8265, "gcs": 6379, "serve": SERVE_PORT, "client": 10001})


def _policies(opt_in: bool = False) -> list[dict]:
    paths = [*RAYSERVICES, VALKEY, MINIO, PGVECTOR, *TOOLS.values(), *(OPT_IN if opt_in else [])]
    return [d for path in paths for d in documents(path) if d["kind"] == "NetworkPolicy"]


(_VALKEY_DEPLOYMENT,) = of_kind(VALKEY, "Deployment")
VALKEY_POD = Pod(_VALKEY_DEPLOYMENT["spec"]["template"]["metadata"]["labels"], ports={"redis": 6379})


def _statefulset_pod(path) -> Pod:
    (statefulset,) = of_kind(path, "StatefulSet")
    template = statefulset["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return Pod(template["metadata"]["labels"], ports={p["name"]: p["containerPort"] for p in container["ports"]})


MINIO_POD, PGVECTOR_POD = _statefulset_pod(MINIO), _statefulset_pod(PGVECTOR)
# Each store's pod and the port its Service serves.
STORES = {"valkey": (VALKEY_POD, 6379), "minio": (MINIO_POD, 9000), "pgvector": (PGVECTOR_POD, 5432)}
NEIGHBOUR = Pod({"app": "something-else"})  # any other pod of the namespace
ELSEWHERE = Pod({"app": "something-else"}, namespace="team-b")
OPERATOR = Pod({"app.kubernetes.io/name": "kuberay-operator"}, namespace="kuberay-system")
FAKE_OPERATOR = Pod({"app.kubernetes.io/name": "kuberay-operator"}, namespace="team-b")  # labels are free to anyone
PROMETHEUS = Pod({"app.kubernetes.io/name": "prometheus"}, namespace="prometheus-system")
DNS = Pod({"k8s-app": "kube-dns"}, namespace="kube-system")
INTERNET = Address("203.0.113.7")
METADATA = Address("169.254.169.254")


def test_the_evaluator_follows_the_networkpolicy_rules():
    """tests/support/netpol.py on small policies whose meaning the Kubernetes documentation states."""
    a, b = Pod({"app": "a"}), Pod({"app": "b"}, ports={"http": 80})
    assert allowed([], a, b, 80)  # no policy: open
    deny = {"metadata": {"name": "d"}, "spec": {"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Ingress"]}}
    assert not allowed([deny], a, b, 80)
    assert allowed([deny], b, a, 80)  # selected: closed; others open
    from_a = {
        "metadata": {"name": "f"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "b"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": "http"}]}],
        },
    }
    assert allowed([deny, from_a], a, b, 80)  # policies add up
    assert not allowed([from_a], a, b, 81)  # the named port is 80 only
    assert not allowed([from_a], Pod({"app": "a"}, namespace="other"), b, 80)  # a podSelector alone: own namespace
    assert not allowed([from_a], Pod({"app": "c"}), b, 80)
    no_egress = {"metadata": {"name": "e"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []}}
    assert not allowed([no_egress], a, Pod({"app": "b"}), 80)  # the source's egress counts too
    block = {
        "metadata": {"name": "i"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "a"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}]}],
        },
    }
    assert allowed([block], a, INTERNET, 443)
    assert not allowed([block], a, METADATA, 80)


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_only_the_serve_port_is_open_to_others(path):
    policies, ray = _policies(), _ray_pod(path)
    others = [NEIGHBOUR, ELSEWHERE, FAKE_OPERATOR, PROMETHEUS, INTERNET, VALKEY_POD, MINIO_POD, PGVECTOR_POD]
    others += [_ray_pod(p) for p in RAYSERVICES if p != path]  # another RayService is another
    for source in others:  # what this RayService's pods let in, whatever the source may send
        assert admits(policies, source, ray, SERVE_PORT), source
        for port in RAY_PORTS:
            assert not admits(policies, source, ray, port), (source, port)
    assert allowed(policies, NEIGHBOUR, ray, SERVE_PORT)
    assert allowed(policies, INTERNET, ray, SERVE_PORT)


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_ray_reaches_its_own_pods_on_every_port(path):
    policies, ray = _policies(), _ray_pod(path)
    for port in [SERVE_PORT, *RAY_PORTS, 44217]:
        assert allowed(policies, ray, ray, port)


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_the_operator_reaches_the_dashboard_only(path):
    policies, ray = _policies(), _ray_pod(path)
    assert allowed(policies, OPERATOR, ray, 8265)
    for port in [p for p in RAY_PORTS if p != 8265]:
        assert not allowed(policies, OPERATOR, ray, port), port


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_what_ray_pods_reach(path):
    policies, ray = _policies(), _ray_pod(path)
    for store, port in STORES.values():  # the response store, the files' contents, the vector index
        assert allowed(policies, ray, store, port)
        assert not allowed(policies, ray, store, port + 1)
    assert allowed(policies, ray, DNS, 53, "UDP")
    assert allowed(policies, ray, DNS, 53, "TCP")
    assert allowed(policies, ray, INTERNET, 443)  # the model hub; the Kubernetes API
    assert not allowed(policies, ray, INTERNET, 80)
    assert not allowed(policies, ray, METADATA, 80)
    assert not allowed(policies, ray, METADATA, 443)
    assert not allowed(policies, ray, NEIGHBOUR, 8080)
    assert not allowed(policies, ray, ELSEWHERE, 5432)


@pytest.mark.parametrize("name", sorted(STORES))
def test_each_store_is_reachable_from_the_rayservices_only_and_reaches_nothing(name):
    """The Valkey, MinIO and PostgreSQL: the RayServices' Ray pods on the store's port, no one
    else (the tools' pods, the other stores, Prometheus opted in included); nothing out."""
    policies, (store, port) = _policies(opt_in=True), STORES[name]
    for path in RAYSERVICES:
        assert allowed(policies, _ray_pod(path), store, port)
    others = [pod for other, (pod, _) in STORES.items() if other != name]
    for source in (NEIGHBOUR, ELSEWHERE, OPERATOR, PROMETHEUS, INTERNET, *others, _tool_pod("python"), _tool_pod("browser")):
        assert not admits(policies, source, store, port), source
        assert not allowed(policies, source, store, port), source
    for destination, to in ((INTERNET, 443), (DNS, 53), (_ray_pod(RAYSERVICES[0]), SERVE_PORT), (METADATA, 80), *STORES.values()):
        assert not allowed(policies, store, destination, to), destination


def test_prometheus_may_scrape_the_metrics_only_when_opted_in():
    ray = _ray_pod(RAYSERVICES[0])
    assert not allowed(_policies(), PROMETHEUS, ray, 8080)
    policies = _policies(opt_in=True)
    assert allowed(policies, PROMETHEUS, ray, 8080)
    for port in [p for p in RAY_PORTS if p != 8080]:
        assert not allowed(policies, PROMETHEUS, ray, port)
    assert not allowed(policies, NEIGHBOUR, ray, 8080)
    assert not allowed(policies, PROMETHEUS, VALKEY_POD, 6379)


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_each_rayservice_file_brings_the_policies_of_its_own_pods(path):
    """A RayService is never applied without its NetworkPolicies, and those select its pods
    only (the instance label is the RayService's name)."""
    service = rayservice(path)
    assert _labels(path)["app.kubernetes.io/instance"] == service["metadata"]["name"]
    policies = of_kind(path, "NetworkPolicy")
    assert policies
    assert all(p["spec"]["podSelector"]["matchLabels"] == _labels(path) for p in policies)
    directions = {t for p in policies for t in p["spec"]["policyTypes"]}
    assert directions == {"Ingress", "Egress"}


# -- the tools' MCP servers ------------------------------------------------------------------


def _tool_pod(tool: str, ip: str = "10.244.3.9") -> Pod:
    (deployment,) = of_kind(TOOLS[tool], "Deployment")
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return Pod(template["metadata"]["labels"], ports={p["name"]: p["containerPort"] for p in container["ports"]}, ip=ip)


def _tool_port(tool: str) -> int:
    (service,) = of_kind(TOOLS[tool], "Service")
    (port,) = service["spec"]["ports"]
    return port["port"]


@pytest.mark.parametrize("tool", ["python", "browser"])
def test_each_tool_serves_its_command_on_its_service_port(tool):
    (deployment,) = of_kind(TOOLS[tool], "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:3] == ["responses-serve", "tool", tool]
    assert command[command.index("--host") + 1] == "0.0.0.0"  # in its pod; the NetworkPolicy admits callers
    assert int(command[command.index("--port") + 1]) == _tool_port(tool) == container["ports"][0]["containerPort"]


@pytest.mark.parametrize("tool", ["python", "browser"])
def test_only_the_ray_pods_call_the_tools(tool):
    policies, server, port = _policies(), _tool_pod(tool), _tool_port(tool)
    for path in RAYSERVICES:
        assert allowed(policies, _ray_pod(path), server, port)  # both ends: the Ray pods' egress too
    for source in (
        NEIGHBOUR,
        ELSEWHERE,
        OPERATOR,
        PROMETHEUS,
        *(pod for pod, _ in STORES.values()),
        INTERNET,
        _tool_pod("python" if tool == "browser" else "browser"),
    ):
        assert not admits(policies, source, server, port), source


def test_the_python_tool_runs_in_a_sandboxed_runtime_and_reaches_nothing():
    (deployment,) = of_kind(TOOLS["python"], "Deployment")
    assert deployment["spec"]["template"]["spec"]["runtimeClassName"] in ("gvisor", "kata", "kata-qemu", "kata-fc", "kata-clh")
    policies, server = _policies(), _tool_pod("python")
    for destination, port, protocol in (
        (DNS, 53, "UDP"),
        (INTERNET, 443, "TCP"),
        (METADATA, 80, "TCP"),
        (VALKEY_POD, 6379, "TCP"),
        (_ray_pod(RAYSERVICES[0]), SERVE_PORT, "TCP"),
        (NEIGHBOUR, 80, "TCP"),
        (Address("10.0.0.1"), 443, "TCP"),
    ):
        assert not allowed(policies, server, destination, port, protocol), destination


def test_the_browser_reaches_the_web_but_not_the_cluster_nor_the_metadata_service():
    policies, browser = _policies(), _tool_pod("browser")
    assert allowed(policies, browser, DNS, 53, "UDP")
    assert allowed(policies, browser, Pod({"app.kubernetes.io/name": "searxng"}, ip="10.244.7.7"), 8080)
    for public in ("203.0.113.7", "8.8.8.8", "2606:4700::1111"):
        assert allowed(policies, browser, Address(public), 443)
        assert allowed(policies, browser, Address(public), 80)
        assert not allowed(policies, browser, Address(public), 22)
    for private in (
        "10.96.0.1",  # a Service address; the API server
        "10.244.1.5",  # a pod
        "172.20.0.5",
        "192.168.1.1",
        "100.64.0.1",
        "127.0.0.1",
        "169.254.169.254",  # the cloud metadata service
        "fd00:ec2::254",  # AWS's IPv6 metadata service
        "fe80::1",
        "::ffff:10.0.0.1",
        "64:ff9b::a00:1",  # NAT64 to 10.0.0.1
    ):
        assert not allowed(policies, browser, Address(private), 443), private
    ray = Pod(_labels(RAYSERVICES[0]), ports={"dashboard": 8265}, ip="10.244.2.2")
    assert not allowed(policies, browser, ray, 8265)
    assert not allowed(policies, browser, ray, 443)
    assert not allowed(policies, browser, Pod(VALKEY_POD.labels, ip="10.244.4.4"), 6379)
