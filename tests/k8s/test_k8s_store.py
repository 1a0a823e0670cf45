"""k8s/store/: the Valkey the RayServices use as their response store and GCS fault-tolerance
store, checked against Kubernetes' own schemas (kubernetes-validate, strict), wired to the
RayServices with a user and password for each, and run: its container's own script starts a
real server (tests/support/redis_server.py ManifestValkey) whose users the tests attack."""

from __future__ import annotations

import fnmatch
import re
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import redis

from tests.conftest import K8S_PASSWORDS
from tests.k8s.manifests import (
    RAYSERVICES,
    VALKEY,
    applications,
    documents,
    env,
    groups,
    ingress_store_settings,
    ray_container,
    rayservice,
    runs_ingress,
    valkey_container,
)


def test_valkey_manifests_are_valid_kubernetes():
    found = documents(VALKEY)
    assert sorted(d["kind"] for d in found) == ["Deployment", "NetworkPolicy", "Service"]
    for document in found:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def _acl_users() -> dict[str, str]:
    """The ACL line of each user the container's script writes, by its environment variable."""
    script = valkey_container()["args"][0]
    return {m.group(1): m.group(0) for m in re.finditer(r'user \$(\w+)_USER on .*"', script)}


def test_the_store_and_the_gcs_have_a_user_and_a_secret_each():
    """Separate credentials: a leaked store password (every ingress replica holds it) does not
    open Ray's GCS state, and the GCS's does not open the stored responses."""
    valkey = env(valkey_container())
    store_user, gcs_user = valkey["STORE_USER"]["value"], valkey["GCS_USER"]["value"]
    store_secret = valkey["STORE_PASSWORD"]["valueFrom"]["secretKeyRef"]
    gcs_secret = valkey["GCS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert store_user != gcs_user
    assert store_secret["name"] != gcs_secret["name"]
    assert set(_acl_users()) == {"STORE", "GCS"}
    for path in RAYSERVICES:
        service = rayservice(path)
        options = service["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
        assert options["redisUsername"] == {"value": gcs_user}
        assert options["redisPassword"] == {"valueFrom": {"secretKeyRef": gcs_secret}}
        url, password_secret, _ = ingress_store_settings(path)
        assert urlsplit(url).username == store_user
        assert urlsplit(url).password is None
        assert password_secret == store_secret["name"]
        (application,) = applications(service)
        assert application["args"]["store"]["type"] == "redis"
        for group in groups(service):
            refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in env(ray_container(group)).values() if "valueFrom" in e]
            assert gcs_secret["name"] not in refs  # KubeRay hands it to the head's GCS alone
            # The store's password only where ingress replicas run (not on GPU pods).
            assert (store_secret["name"] in refs) == runs_ingress(service, group), group.get("groupName", "head")


def test_each_users_keys_are_the_ones_it_needs_and_no_others():
    patterns = {name: re.findall(r" ~(\S+)", line) for name, line in _acl_users().items()}
    for path in RAYSERVICES:
        _url, _secret, key_prefix = ingress_store_settings(path)
        assert any(fnmatch.fnmatchcase(key_prefix + "resp_x", p) for p in patterns["STORE"])
        assert not any(fnmatch.fnmatchcase(key_prefix + "resp_x", p) for p in patterns["GCS"])
    for ray_key in ("RAY0123-abcd@KV", "DUMMY"):  # Ray's GCS tables; the key it deletes to check the server
        assert any(fnmatch.fnmatchcase(ray_key, p) for p in patterns["GCS"])
        assert not any(fnmatch.fnmatchcase(ray_key, p) for p in patterns["STORE"])


def test_valkey_runs_as_its_non_root_user_and_writes_only_its_volumes():
    (deployment,) = [d for d in documents(VALKEY) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = valkey_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 999
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    valkey = env(container)
    assert set(mounts) == {valkey["DATA_DIR"]["value"], str(_parent(valkey["ACL_FILE"]["value"]))}
    assert all("emptyDir" in volumes[name] for name in mounts.values())
    # The ACL (password hashes) lives in memory only, never on the data volume.
    assert volumes[mounts[_parent(valkey["ACL_FILE"]["value"])]]["emptyDir"]["medium"] == "Memory"
    script = container["args"][0]
    assert "--requirepass" not in script
    assert ">$" not in script  # hashes (#...), not passwords
    (server_line,) = [line for line in script.splitlines() if line.strip().startswith("exec ")]
    assert "PASSWORD" not in server_line  # nor on the command line


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


def test_the_rayservices_reach_the_valkey_service():
    (service,) = [d for d in documents(VALKEY) if d["kind"] == "Service"]
    address = f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    for path in RAYSERVICES:
        ray = rayservice(path)
        assert ray["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["redisAddress"] == address
        url, _secret, _prefix = ingress_store_settings(path)
        assert urlsplit(url).netloc.split("@")[1] == address
        assert urlsplit(url).path == "/0"
        for group in groups(ray):
            if runs_ingress(ray, group):
                assert env(ray_container(group))["REDIS_URL"]["value"] == url


# -- the running Valkey, started by the manifest's own script ----------------------------------


def _client(valkey, user: str | None, password: str | None) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=valkey.port, username=user, password=password, socket_timeout=5)


def test_the_users_file_holds_no_password_and_only_valkey_reads_it(k8s_valkey):
    text = k8s_valkey.acl_file.read_text()
    assert oct(k8s_valkey.acl_file.stat().st_mode & 0o777) == "0o600"
    for password in K8S_PASSWORDS.values():
        assert password not in text
    assert "user default off" in text


@pytest.mark.slow
def test_no_one_gets_in_without_a_user_and_its_password(k8s_valkey):
    with pytest.raises(redis.AuthenticationError):  # the default user is off
        _client(k8s_valkey, None, None).get("responses-serve:x")
    with pytest.raises(redis.AuthenticationError):
        _client(k8s_valkey, k8s_valkey.env["STORE_USER"], K8S_PASSWORDS["responses-serve-gcs"]).ping()
    with pytest.raises(redis.AuthenticationError):  # each password opens its own user only
        _client(k8s_valkey, k8s_valkey.env["GCS_USER"], K8S_PASSWORDS["responses-serve-store"]).ping()


def test_the_store_user_reaches_the_responses_only(k8s_valkey):
    store = _client(k8s_valkey, k8s_valkey.env["STORE_USER"], K8S_PASSWORDS["responses-serve-store"])
    gcs = _client(k8s_valkey, k8s_valkey.env["GCS_USER"], K8S_PASSWORDS["responses-serve-gcs"])
    gcs.hset("RAYacl-test@KV", "field", "cluster state")
    store.set("responses-serve:acl-test:resp_1", "a response", px=60_000)
    assert store.get("responses-serve:acl-test:resp_1") == b"a response"
    for attack in (
        lambda: store.hgetall("RAYacl-test@KV"),  # Ray's GCS state
        lambda: store.delete("RAYacl-test@KV"),
        lambda: store.set("elsewhere", "x"),
        lambda: store.flushall(),
        lambda: store.keys("*"),
        lambda: store.config_get("*"),
        lambda: store.acl_list(),
        lambda: store.execute_command("DEBUG", "SLEEP", "0"),
        lambda: store.publish("channel", "x"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attack()
    assert gcs.hget("RAYacl-test@KV", "field") == b"cluster state"


def test_the_gcs_user_reaches_rays_keys_only(k8s_valkey):
    store = _client(k8s_valkey, k8s_valkey.env["STORE_USER"], K8S_PASSWORDS["responses-serve-store"])
    gcs = _client(k8s_valkey, k8s_valkey.env["GCS_USER"], K8S_PASSWORDS["responses-serve-gcs"])
    store.set("responses-serve:acl-test:resp_2", "a response", px=60_000)
    for attack in (
        lambda: gcs.get("responses-serve:acl-test:resp_2"),
        lambda: gcs.delete("responses-serve:acl-test:resp_2"),
        lambda: gcs.flushall(),
        lambda: gcs.keys("*"),
        lambda: gcs.config_set("maxmemory", "1"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attack()
    # What Ray's GCS does (tests/k8s/test_k8s_pod.py runs a real one as this user).
    assert gcs.info("cluster") is not None
    assert gcs.delete("DUMMY") == 0
    assert store.get("responses-serve:acl-test:resp_2") == b"a response"


def test_password_only_from_secrets_in_the_valkey():
    for entry in valkey_container()["env"]:
        if "PASSWORD" in entry["name"]:
            assert set(entry) == {"name", "valueFrom"}
            assert set(entry["valueFrom"]) == {"secretKeyRef"}
