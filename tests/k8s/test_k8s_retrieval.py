"""k8s/store/minio.yaml and k8s/store/pgvector.yaml: the object store of the Files API and the
PostgreSQL with pgvector of the vector stores, checked against Kubernetes' own schemas
(kubernetes-validate, strict), wired to the RayServices (the config each serveConfigV2 carries,
loaded by the app's own config model; credentials only from the Secrets, as variables), and
PostgreSQL's first-start SQL run on a real server (pgserver's) whose app role the tests attack.
(Restricted pods and the NetworkPolicies, evaluated offline: tests/k8s/test_k8s_security.py.)"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest

from serve_app.config import AppConfig, VectorStoresConfig
from serve_app.retrieval.embeddings import HashingEmbedder
from tests.k8s.manifests import (
    MINIO,
    PGVECTOR,
    RAYSERVICES,
    applications,
    documents,
    env,
    groups,
    of_kind,
    ray_container,
    rayservice,
    runs_ingress,
    server_container,
    service_address,
)

# The Secrets' values (made by `kubectl create secret`, never in git), by (Secret, key). The
# password holds what SQL and shells would misread.
SECRETS = {
    ("responses-serve-s3", "access-key"): "access-" + secrets.token_hex(8),
    ("responses-serve-s3", "secret-key"): "s3-" + secrets.token_hex(16),
    ("responses-serve-pgvector", "password"): "pg'\"; DROP ROLE x; --\\ $HOME " + secrets.token_hex(8),
}


def _secret_refs(container: dict) -> dict[str, tuple[str, str]]:
    """The container's variables set from a Secret: name -> (Secret, key)."""
    refs = {}
    for name, entry in env(container).items():
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            refs[name] = (ref["name"], ref["key"])
    return refs


def _app_config(path: Path) -> AppConfig:
    (application,) = applications(rayservice(path))
    return AppConfig.model_validate(application["args"])


def _vector_stores() -> VectorStoresConfig:
    """The RayServices' `vector_stores` (the same in each: they share the index)."""
    (dumped,) = {json.dumps(_app_config(path).model_dump(mode="json")["vector_stores"], sort_keys=True) for path in RAYSERVICES}
    return VectorStoresConfig.model_validate_json(dumped)


def _ingress_environment(path: Path) -> dict[str, str]:
    """The variables an ingress replica's pod sets from Secrets, with the Secrets' values."""
    head = ray_container(groups(rayservice(path))[0])
    return {name: SECRETS[ref] for name, ref in _secret_refs(head).items() if ref in SECRETS}


@pytest.mark.parametrize("path", [MINIO, PGVECTOR], ids=lambda p: p.name)
def test_store_manifests_are_valid_kubernetes(path):
    found = documents(path)
    assert sorted(d["kind"] for d in found) == ["NetworkPolicy", "Service", "StatefulSet"]
    for document in found:
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("path", [MINIO, PGVECTOR], ids=lambda p: p.name)
def test_each_server_keeps_its_data_on_a_claim_of_its_own(path):
    """One replica whose data is on its PersistentVolumeClaim (it outlives the pod); everything
    else it writes is an emptyDir; its Service routes to its one port."""
    (statefulset,) = of_kind(path, "StatefulSet")
    (service,) = of_kind(path, "Service")
    spec, template = statefulset["spec"], statefulset["spec"]["template"]
    assert spec["replicas"] == 1
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    container = server_container(path)
    (port,) = container["ports"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"] for v in template["spec"]["volumes"]}
    assert set(mounts) == volumes | {claim["metadata"]["name"]}
    data = mounts[claim["metadata"]["name"]]
    if path == MINIO:
        command = container["command"]
        assert command[:3] == ["minio", "server", data]
        assert command[command.index("--address") + 1] == f":{port['containerPort']}"
        assert env(container)["MINIO_BROWSER"]["value"] == "off"  # no console on another port
    else:
        pgdata = env(container)["PGDATA"]["value"]
        assert pgdata.startswith(data + "/")  # below the volume's root, which may hold lost+found


def test_the_rayservices_keep_files_in_minio_with_its_keys():
    """files.blob: MinIO's Service, its keys from the Secret MinIO's root user is made from, in
    the variables the config names, on exactly the pods where ingress replicas run; each
    RayService under a prefix of its own."""
    minio = _secret_refs(server_container(MINIO))
    prefixes = set()
    for path in RAYSERVICES:
        service = rayservice(path)
        blob = _app_config(path).files.blob
        assert (blob.type, blob.endpoint, blob.secure) == ("s3", service_address(MINIO), False)
        prefixes.add(blob.key_prefix)
        for group in groups(service):
            refs = _secret_refs(ray_container(group))
            if runs_ingress(service, group):
                assert refs[blob.access_key_env] == minio["MINIO_ROOT_USER"]
                assert refs[blob.secret_key_env] == minio["MINIO_ROOT_PASSWORD"]
            else:
                assert blob.access_key_env not in refs
                assert blob.secret_key_env not in refs
    assert len(prefixes) == len(RAYSERVICES)
    assert "" not in prefixes


def test_the_rayservices_index_vector_stores_in_postgres_as_the_app_role():
    """vector_stores: the pgvector index at PostgreSQL's Service, as the role and database the
    first start makes, its password from the Secret that role is made with (never in the url),
    on exactly the pods where ingress replicas run."""
    server = env(server_container(PGVECTOR))
    password_ref = _secret_refs(server_container(PGVECTOR))["APP_PASSWORD"]
    for path in RAYSERVICES:
        service = rayservice(path)
        stores = _app_config(path).vector_stores
        assert stores is not None
        assert stores.index == "pgvector"
        assert stores.url is not None
        url = urlsplit(stores.url)
        assert f"{url.hostname}:{url.port}" == service_address(PGVECTOR)
        assert url.username == server["APP_USER"]["value"]
        assert url.path == "/" + server["APP_DB"]["value"]
        assert url.password is None
        for group in groups(service):
            refs = _secret_refs(ray_container(group))
            assert (refs.get(stores.password_env) == password_ref) == runs_ingress(service, group)
            assert runs_ingress(service, group) or stores.password_env not in refs


def test_postgres_takes_every_connection_the_ingress_replicas_may_open():
    """Each ingress replica opens up to `pool_max_size` connections: PostgreSQL's max_connections
    holds every RayService at its most ingress replicas, one of them twice (an upgrade brings up
    a new cluster beside the old), and a few for the superuser (`kubectl exec ... psql`)."""
    script = server_container(PGVECTOR)["args"][0]
    (limit,) = re.findall(r"exec docker-entrypoint\.sh postgres -c max_connections=(\d+)\n", script)
    replicas = []
    for path in RAYSERVICES:
        config = _app_config(path)
        autoscaling = config.ingress.autoscaling_config or {}
        replicas.append(int(autoscaling.get("max_replicas", config.ingress.num_replicas or 1)))
    most = (sum(replicas) + max(replicas)) * _vector_stores().pool_max_size
    assert int(limit) >= most + 10


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda p: p.name)
def test_the_credentials_reach_the_clients_from_the_environment_only(path, monkeypatch):
    """With the Secrets' values in the environment (as on the pods), the app's config holds
    none of them (Ray keeps a deployment's arguments in its GCS and shows them on its
    dashboard), and the clients built from it carry them: the variables are the only route."""
    from serve_app.retrieval.pgvector import PgVectorIndex
    from serve_app.runtime.vector_stores import vector_store_service
    from serve_app.state.blobs import S3BlobStore

    environment = _ingress_environment(path)
    assert set(environment.values()) == set(SECRETS.values())
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    config = _app_config(path)
    text = rayservice(path)["spec"]["serveConfigV2"] + json.dumps(config.model_dump(mode="json"))
    assert not [value for value in SECRETS.values() if value in text]
    blobs = config.files.blob.blob_store()
    assert isinstance(blobs, S3BlobStore)
    credentials = blobs.client._provider.retrieve()
    assert (credentials.access_key, credentials.secret_key) == (
        SECRETS["responses-serve-s3", "access-key"],
        SECRETS["responses-serve-s3", "secret-key"],
    )
    assert config.vector_stores is not None
    # The served embedding model's stand-in (its EmbeddingServer is not started here).
    embedder = HashingEmbedder(config.vector_stores.embedding.dimensions)
    index = vector_store_service(config.vector_stores, embedder).index
    assert isinstance(index, PgVectorIndex)
    assert index._password == SECRETS["responses-serve-pgvector", "password"]
    assert index.url == config.vector_stores.url


def test_the_secrets_are_read_from_the_environment_and_never_written_down():
    """PostgreSQL's container script: the app role's password only through psql's \\getenv
    (no file, no command line), the superuser's random and kept nowhere."""
    script = server_container(PGVECTOR)["args"][0]
    sql = _first_start_sql()
    assert "\\getenv app_password APP_PASSWORD" in sql
    assert "$APP_PASSWORD" not in sql  # a quoted heredoc: the shell expands nothing in it
    assert "<<'SQL'" in script
    assert re.search(r"POSTGRES_PASSWORD=\"\$\(od .*/dev/urandom", script)
    assert "POSTGRES_PASSWORD" not in env(server_container(PGVECTOR))


def _first_start_sql() -> str:
    """The SQL PostgreSQL's container writes into /docker-entrypoint-initdb.d (the image runs
    it once, on a new data directory, as the superuser, in the database `postgres`)."""
    script = server_container(PGVECTOR)["args"][0]
    (sql,) = re.findall(r"<<'SQL'\n(.*?)\nSQL\n", script, re.S)
    return sql


# -- the first start's SQL on a real PostgreSQL --------------------------------------------------


@pytest.fixture(scope="module")
def first_started(tmp_path_factory):
    """pgserver's PostgreSQL after the manifest's first-start SQL, run as the image's entrypoint
    runs it (psql -v ON_ERROR_STOP=1 --no-psqlrc, the manifest's variables); then, as in the pod
    for any client but the superuser on its own socket, passwords required (SCRAM)."""
    from tests.support.postgres_server import postgres_server, psql_binary

    server_env = env(server_container(PGVECTOR))
    variables = {name: server_env[name]["value"] for name in ("APP_USER", "APP_DB")}
    variables["APP_PASSWORD"] = SECRETS["responses-serve-pgvector", "password"]
    script = tmp_path_factory.mktemp("initdb") / "responses-serve.sql"
    script.write_text(_first_start_sql() + "\n")
    with postgres_server() as server:
        psql = [str(psql_binary()), "-v", "ON_ERROR_STOP=1", "--no-password", "--no-psqlrc", "--dbname", server.get_uri()]
        done = subprocess.run([*psql, "-f", str(script)], env=variables, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        (Path(server.pgdata) / "pg_hba.conf").write_text("local all postgres trust\nlocal all all scram-sha-256\n")
        subprocess.run([*psql, "-c", "SELECT pg_reload_conf()"], check=True, capture_output=True, timeout=60)
        yield server, variables


def _app_url(server, variables: dict[str, str], database: str | None = None) -> str:
    """The RayServices' url (user and database), at this server's socket."""
    parts = urlsplit(_vector_stores().url)
    return f"postgresql://{parts.username}@/{database or parts.path.lstrip('/')}?host={server.pgdata}"


@pytest.mark.slow
def test_the_app_role_indexes_and_searches_with_its_password_only(first_started):
    import psycopg

    from serve_app.retrieval.index import IndexedChunk, Ranking
    from serve_app.retrieval.pgvector import PgVectorIndex

    server, variables = first_started
    url = _app_url(server, variables)
    for wrong in (None, "not the password", variables["APP_PASSWORD"][:-1]):
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, password=wrong, connect_timeout=10).close()
    embedder = HashingEmbedder(_vector_stores().embedding.dimensions)
    index = PgVectorIndex(url, embedder.dimensions, password=variables["APP_PASSWORD"])
    texts = ["The zebra migration crosses the Mara river in July.", "Quarterly revenue grew by twelve percent."]

    async def use() -> list:
        # The app makes its table and indexes as this role (the extension is already there).
        await index.add("team-a/vs_1", [IndexedChunk("file-a", "a.txt", i, t) for i, t in enumerate(texts)], embedder.embed_now(texts))
        query = "zebra migration"
        hits = await index.search("team-a/vs_1", query, embedder.embed_now([query]), max_results=1, ranking=Ranking())
        assert await index.remove_file("team-a/vs_1", "file-a") == 2
        await index.aclose()
        return hits

    (hit,) = asyncio.run(use())
    assert hit.text == texts[0]


@pytest.mark.slow
def test_the_app_role_has_no_other_power(first_started):
    """A leaked app password (every ingress replica holds it) opens the vector index and
    nothing else: no superuser rights, no files or programs of the server, no roles, no other
    database, no settings, no password hashes, not the extension."""
    import psycopg

    server, variables = first_started
    password = variables["APP_PASSWORD"]
    with psycopg.connect(_app_url(server, variables), password=password, autocommit=True, connect_timeout=10) as connection:
        row = connection.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, False, False, False, False)
        for attack in (
            "COPY (SELECT 1) TO PROGRAM 'true'",
            "SELECT pg_read_file('PG_VERSION')",
            "CREATE ROLE intruder LOGIN SUPERUSER",
            "CREATE DATABASE elsewhere",
            "ALTER SYSTEM SET listen_addresses = '*'",
            "SELECT rolpassword FROM pg_authid",
            "DROP EXTENSION vector",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                connection.execute(attack)
    for database in ("postgres", "template1"):
        with pytest.raises(psycopg.OperationalError, match="permission denied"):
            psycopg.connect(_app_url(server, variables, database), password=password, connect_timeout=10).close()


@pytest.mark.slow
def test_the_password_is_kept_as_a_scram_hash_and_the_extension_is_the_superusers(first_started):
    import psycopg

    server, variables = first_started
    with psycopg.connect(server.get_uri(), autocommit=True, connect_timeout=10) as connection:
        (stored,) = connection.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (variables["APP_USER"],)).fetchone()
    assert stored.startswith("SCRAM-SHA-256$")
    assert variables["APP_PASSWORD"] not in stored
    with psycopg.connect(server.get_uri(database=variables["APP_DB"]), autocommit=True, connect_timeout=10) as connection:
        owners = connection.execute(
            "SELECT e.extname, r.rolname FROM pg_extension e JOIN pg_roles r ON r.oid = e.extowner WHERE e.extname = 'vector'"
        ).fetchall()
        (database_owner,) = connection.execute(
            "SELECT r.rolname FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba WHERE d.datname = current_database()"
        ).fetchone()
    assert owners == [("vector", "postgres")]
    assert database_owner == variables["APP_USER"]
