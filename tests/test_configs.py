"""Every config in serve_app/configs/ validates: Serve's own schema and our typed args."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_app.config import AppConfig

CONFIGS = sorted((Path(__file__).parent.parent / "serve_app" / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert any(path.name == "demo.yaml" for path in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path):
    document = yaml.safe_load(path.read_text())
    schema = ServeDeploySchema.model_validate(document)
    for application in schema.applications:
        assert application.import_path == "serve_app.app:build_app"
        config = AppConfig.model_validate(application.args)
        assert config.models


def test_typos_are_caught():
    with pytest.raises(ValueError, match="max_ongoing_request"):
        AppConfig.model_validate({"models": [{"name": "m", "engine": {"max_ongoing_request": 5}}]})
    with pytest.raises(ValueError, match="unique"):
        AppConfig.model_validate({"models": [{"name": "m"}, {"name": "m"}]})
    with pytest.raises(ValueError, match="num_replicas or autoscaling_config"):
        AppConfig.model_validate({"models": [{"name": "m", "engine": {"num_replicas": 2, "autoscaling_config": {"max_replicas": 4}}}]})
    with pytest.raises(Exception, match="min_replicas"):
        AppConfig.model_validate({"models": [{"name": "m", "engine": {"autoscaling_config": {"min_replicas": 5, "max_replicas": 2}}}]})


def test_build_app_rejects_bad_args_with_a_clear_message():
    from serve_app.app import build_app

    with pytest.raises(ValueError, match="invalid responses-serve application args"):
        build_app({"models": []})


def test_build_app_binds_one_engine_per_model():
    from serve_app.app import build_app

    application = build_app({"models": [{"name": "a/b"}, {"name": "c"}]})
    # The ingress is bound with the config and a dict of engine deployments.
    bound = application._bound_deployment
    assert bound.name == "ResponsesIngress"
    engines = bound.init_args[1]
    assert sorted(engines) == ["a/b", "c"]
    assert sorted(e._bound_deployment.name for e in engines.values()) == ["EngineServer-a_b", "EngineServer-c"]
