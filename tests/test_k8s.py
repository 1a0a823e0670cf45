"""The RayService manifests: valid against KubeRay's CRD schema and in step with the configs."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_app.config import AppConfig

ROOT = Path(__file__).parent.parent
MANIFESTS = sorted((ROOT / "k8s").glob("*.yaml"))
# KubeRay's CRD (data for development and CI only; the product never reads it).
CRD = ROOT.parent / "shared" / "kuberay" / "ray.io_rayservices.yaml"


@pytest.fixture(scope="module")
def rayservice_schema() -> dict:
    if not CRD.is_file():
        pytest.skip(f"{CRD} is not here")
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_a_valid_rayservice(path, rayservice_schema):
    manifest = yaml.safe_load(path.read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    jsonschema.validate(manifest, rayservice_schema)
    serve_config = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    for application in serve_config.applications:
        AppConfig.model_validate(application.args)
    # No engine on the head: it advertises no GPUs.
    assert manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"


def test_rayservice_serves_the_gpt_oss_20b_config():
    manifest = yaml.safe_load((ROOT / "k8s" / "rayservice-gpt-oss-20b.yaml").read_text())
    config = yaml.safe_load((ROOT / "serve_app" / "configs" / "gpt-oss-20b.yaml").read_text())
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"] == config["applications"]
