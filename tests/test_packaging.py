"""`pip install .` installs exactly the design card's two packages, `serve_app` and
`deployments`, with the shipped configs and templates, and the project's commands; `bench`,
`tests` and everything else stay in the clone."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_the_wheel_holds_serve_app_and_deployments_only(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("responses_serve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"serve_app", "deployments"}
    assert {"serve_app/configs/demo.yaml", "serve_app/families/templates/qwen3.jinja", "serve_app/py.typed", "deployments/py.typed"} <= set(
        names
    )
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "responses-serve = serve_app.cli:main" in scripts
    assert "responses-serve-haproxy = deployments.haproxy:main" in scripts
