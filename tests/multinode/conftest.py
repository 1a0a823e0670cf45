"""One simulated multi-node Ray cluster (Ray's own `ray.cluster_utils.Cluster`) per session.

A pytest process holds one Ray connection, and the session `serve_url` cluster of
`tests/conftest.py` is another: these tests are marked `multinode`, deselected by default
(pyproject's addopts), and run in their own pytest process: `pytest -m multinode`
(`make test` runs both).

The cluster: a CPU-only head, two "GPU" workers declaring 2 and 4 GPUs (logical: the replay
backend touches no CUDA), one CPU worker. CPU nodes carry the `CPU_ONLY` label, which the
ingress selects, so no ingress replica takes a GPU node's place.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import tests.support.cluster_env  # noqa: F401  (the cluster's environment, before Ray starts)
from tests.support.servers import free_port

CPU_ONLY = {"responses-serve/node": "cpu"}
GPU_NODES = {"gpu-a": 2, "gpu-b": 4}


def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.multinode)


@dataclass
class SimCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    http: str  # the Serve proxy, http://127.0.0.1:PORT
    gpu_nodes: dict[str, Any] = field(default_factory=dict)  # name -> ray._private.node.Node

    def add_gpu_node(self, name: str) -> Any:
        node = self.cluster.add_node(num_cpus=2, num_gpus=GPU_NODES[name])
        self.gpu_nodes[name] = node
        return node


@pytest.fixture(scope="session")
def sim_cluster() -> Iterator[SimCluster]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    # Serve's proxy actor, not its HAProxy ingress (the default, tests/conftest.py): every
    # simulated node would start an HAProxy, and they would all bind the same stats and
    # metrics ports of this one machine. Multi-node HTTP through HAProxy is therefore not
    # covered here (docs/scaling.md, "Failures").
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "0"
    # All nodes share one machine's address: the proxy's preference for the ingress replica
    # on its own node would send every request to the head's. Spread them like on many hosts.
    os.environ.setdefault("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")
    # Serve runs a proxy on the head and on every node with a replica (GPU nodes included),
    # and here they all bind one address: on one port the kernel spreads the clients'
    # connections over all of them (SO_REUSEPORT), and a removed GPU node would cut the
    # streams its proxy relayed, whatever their engine. Clients talk to the head's proxy
    # (like a load balancer in front of the CPU nodes); the workers' proxies get another port.
    os.environ.setdefault("RAY_SERVE_WORKER_PROXY_HTTP_PORT", str(free_port()))
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={
            "num_cpus": 1,
            "num_gpus": 0,
            "labels": CPU_ONLY,
            "gcs_server_port": free_port(),
            "dashboard_port": free_port(),
            "ray_client_server_port": free_port(),
        },
    )
    sim = SimCluster(cluster, http="")
    try:
        for name in GPU_NODES:
            sim.add_gpu_node(name)
        cluster.add_node(num_cpus=1, num_gpus=0, labels=CPU_ONLY)
        cluster.wait_for_nodes()
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        sim.http = f"http://127.0.0.1:{port}"
        yield sim
    finally:
        ray.shutdown()
        cluster.shutdown()


def alive_replicas(app: str, deployment: str) -> list:
    """Ray's own view (the GCS actor table, through the state API) of the live replica actors
    of a deployment. After a node loss the state API has called its answer truncated (its
    total is not what the GCS returned), hence `raise_on_missing_output=False`: the callers
    check the count against Serve's."""
    from ray.util.state import list_actors

    filters = [("class_name", "=", f"ServeReplica:{app}:{deployment}"), ("state", "=", "ALIVE")]
    return list_actors(filters=filters, detail=True, limit=10_000, raise_on_missing_output=False)


def node_gpus() -> dict[str, float]:
    """Node id -> GPUs it declares, for the nodes alive now (the GCS node table)."""
    import ray

    return {n["NodeID"]: n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["Alive"]}


def running_replicas(app: str, deployment: str) -> int:
    from ray import serve

    application = serve.status().applications.get(app)
    status = application.deployments.get(deployment) if application else None
    return status.replica_states.get("RUNNING", 0) if status else 0
