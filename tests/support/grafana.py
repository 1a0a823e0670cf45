"""`k8s/grafana/dashboard.py`, the dashboard generator: a script of the clone (its
grafana-foundation-sdk is a development dependency), not a module of the installed package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).resolve().parents[2] / "k8s" / "grafana" / "dashboard.py"


def load_dashboard() -> ModuleType:
    name = "responses_serve_grafana_dashboard"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PATH)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
