"""The environment a test's Ray cluster starts with, as `responses-serve run` starts one: set
in this process before Ray starts (every process Ray starts inherits it). Imported by the
conftests of the folders that start a cluster (tests/deployments, tests/multinode)."""

from __future__ import annotations

import os

from serve_app.cli.launch import SIDE_PORTS, side_port_env
from serve_app.config.cluster import cluster_env, haproxy_installed_path

# The session's Ray cluster starts as `responses-serve run` starts one (cluster_env: Serve's
# HAProxy ingress spreading requests over the 2 ingress replicas, our HAProxy binary, the
# controller's loop period), set before Ray starts: Serve reads it in every process it starts.
# The HAProxy ingress and binary are forced, not defaulted. HAProxy's stats and metrics
# listeners get ports of their own, so that the session does not collide with a
# `responses-serve run` on the same machine, and Serve's fallback proxy one too (SO_REUSEPORT:
# sharing its port with another cluster's, requests could reach that cluster's app).
os.environ.update(cluster_env())
os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = haproxy_installed_path()  # no splicing
# HAProxy's stats and metrics, Serve's fallback proxy (shared port: see SIDE_PORTS).
os.environ.update(side_port_env(SIDE_PORTS))
# Ray's processes report metrics every 2 s instead of 10 s: the metric tests see what they
# wait for sooner, and a gauge series not set again is dropped after 4 s instead of 20 s
# (the gauges follow it: deployments/metrics.py `gauge_refresh_s`).
os.environ.setdefault("RAY_metrics_report_interval_ms", "2000")
