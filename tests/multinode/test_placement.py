"""GPU placement on a simulated multi-node cluster, asserted from Ray's own view.

Replay engines declared `device: gpu` with TP=2 and TP=2 x PP=2 go through the placement
code path of vLLM engines (`deployments.builder.engine_deployment_options` ->
`serve_app.engines.vllm.placement_bundles`); what is checked is where Ray put them:
the placement-group table, and the node of every replica actor (state API).
"""

from __future__ import annotations

import pytest

from tests.multinode.conftest import CPU_ONLY, alive_replicas, node_gpus, running_replicas
from tests.support import sdk_scenarios

APP = "placement"
ARGS = {
    "models": [
        {"name": "tp2", "backend": {"type": "replay", "device": "gpu", "tensor_parallel_size": 2}, "engine": {"num_replicas": 1}},
        {
            "name": "tp2pp2",
            "backend": {"type": "replay", "device": "gpu", "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
            "engine": {"num_replicas": 1},
        },
    ],
    "ingress": {
        "num_replicas": 2,
        "max_replicas_per_node": 1,
        "max_ongoing_requests": 1024,
        "ray_actor_options": {"num_cpus": 0, "label_selector": CPU_ONLY},
    },
}


@pytest.fixture(scope="module")
def placement_app(sim_cluster):
    from ray import serve

    from deployments.builder import build_app

    serve.run(build_app(ARGS), name=APP, route_prefix=f"/{APP}")
    try:
        yield f"{sim_cluster.http}/{APP}/v1"
    finally:
        serve.delete(APP)  # frees the GPUs for the failure tests


@pytest.mark.parametrize("model", ["tp2", "tp2pp2"])
def test_engine_placement_groups_land_on_gpu_nodes_only(placement_app, model):
    import ray

    from serve_app.config import AppConfig

    config = {m.name: m for m in AppConfig.model_validate(ARGS).models}[model]
    assert running_replicas(APP, config.deployment_name) == 1
    (replica,) = alive_replicas(APP, config.deployment_name)
    # Ray's placement-group table: the group the replica actor was created in.
    group = ray.util.placement_group_table()[replica.placement_group_id]
    gpus = node_gpus()

    assert group["state"] == "CREATED"
    # Tensor parallel alone must not span nodes; pipeline stages may.
    assert group["strategy"] == ("STRICT_PACK" if model == "tp2" else "PACK")
    bundles = [group["bundles"][i] for i in sorted(group["bundles"])]
    assert [b.get("GPU") for b in bundles] == [1.0] * config.backend.world_size  # one GPU per TP x PP worker
    assert bundles[0].get("CPU") == 1.0  # the replica's CPU
    assert not any(b.get("CPU") for b in bundles[1:])
    bundle_nodes = [group["bundles_to_node_id"][i] for i in sorted(group["bundles_to_node_id"])]
    assert len(bundle_nodes) == config.backend.world_size
    assert all(gpus[node] > 0 for node in bundle_nodes)  # only GPU nodes
    assert replica.node_id == bundle_nodes[0]  # the replica sits in bundle 0
    if model == "tp2":
        assert len(set(bundle_nodes)) == 1


def test_ingress_replicas_only_where_there_is_no_gpu(placement_app):
    replicas = alive_replicas(APP, "ResponsesIngress")
    assert running_replicas(APP, "ResponsesIngress") == len(replicas) == 2
    gpus = node_gpus()
    assert all(gpus[r.node_id] == 0 for r in replicas)
    assert len({r.node_id for r in replicas}) == 2  # the head and the CPU worker


def test_placed_engines_serve(placement_app):
    for model in ("tp2", "tp2pp2"):
        events = sdk_scenarios.raw_stream(placement_app, {"model": model, "input": f"placed {model}"})
        assert events[-1]["response"]["output"][-1]["content"][0]["text"] == f"placed {model}"
