"""API keys, tenants and quotas through Serve: the session's secured application (tests/deployments/conftest.py
SECURED_ARGS) runs two ingress replicas behind the proxy under the route prefix /api, on the
embedded store. The same scenarios as in-process (tests/server/test_auth.py, test_quotas.py)."""

from __future__ import annotations

from tests.deployments.conftest import METERED_RPM, SECURED_PREFIX, SECURED_RPM, TENANT_KEYS
from tests.support import tenant_scenarios


def test_no_route_answers_without_a_key_under_the_prefix(secured_url):
    paths = [
        f"{SECURED_PREFIX}{path}"
        for path in (
            "/v1/models",
            "/v1/models/gpt-oss-replay",
            "/v1/responses",
            "/v1/responses/resp_1",
            "/v1/responses/resp_1/cancel",
            "/v1/responses/resp_1/input_items",
            "/v1/responses/input_tokens",
            "/v1/conversations",
            "/v1/conversations/conv_1/items",
            "/openapi.json",
            "/docs",
            "//v1/models",
            "/v1//models",
            "/%76%31/models",
            "/health/../v1/models",
        )
    ]
    # (A path outside the prefix, such as //api/v1/models, is the session's open app's at "/".)
    paths += [f"{SECURED_PREFIX}{SECURED_PREFIX}/v1/models", f"{SECURED_PREFIX}/health/", f"{SECURED_PREFIX}/HEALTH"]
    tenant_scenarios.unauthenticated_everywhere(secured_url, TENANT_KEYS["team-a"], paths)


def test_tenants_cannot_see_each_other_across_replicas(secured_url):
    tenant_scenarios.tenants_cannot_see_each_other(secured_url, TENANT_KEYS["team-a"], TENANT_KEYS["team-b"])


def test_requests_per_minute_holds_across_both_replicas(secured_url, secured_ingress_urls):
    """The burst alternates between the two replicas (each at its own address): each admits
    some, both together no more than the one limit."""
    assert len(secured_ingress_urls) == 2
    tenant_scenarios.burst_within_requests_per_minute(secured_ingress_urls, TENANT_KEYS["burst"], per_minute=SECURED_RPM)
    tenant_scenarios.the_sdk_retries_after_a_429(secured_url, TENANT_KEYS["burst"])


def test_every_answer_carries_rate_headers_and_only_writes_count_across_replicas(secured_ingress_urls):
    tenant_scenarios.every_answer_carries_rate_headers_and_only_writes_count(
        secured_ingress_urls, TENANT_KEYS["metered"], requests_per_minute=METERED_RPM
    )


def test_a_tenant_hits_its_own_cached_prefix_only(secured_ingress_urls):
    tenant_scenarios.cached_prefixes_are_each_tenants_own(secured_ingress_urls, TENANT_KEYS["team-a"], TENANT_KEYS["team-b"])


def test_max_concurrent_requests_and_max_background_refuse_the_next(secured_url):
    tenant_scenarios.max_concurrent_requests_refuses_the_next(secured_url, TENANT_KEYS["busy"], "gpt-oss-replay", limit=2)
    tenant_scenarios.max_background_refuses_the_next(secured_url, TENANT_KEYS["busy"], "gpt-oss-replay", limit=1)


def test_no_key_is_in_any_log_of_the_cluster(secured_url):
    """After every scenario above (401s with wrong keys included): no log file of the cluster
    (Serve's, the replicas', Ray's own) holds any of the keys."""
    from pathlib import Path

    import ray

    tenant_scenarios.tenants_cannot_see_each_other(secured_url, TENANT_KEYS["team-a"], TENANT_KEYS["team-b"])
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    files = [path for path in logs.rglob("*") if path.is_file()]
    assert any("ResponsesIngress" in path.name for path in files), "no replica log found"
    for path in files:
        text = path.read_bytes()
        for tenant, key in TENANT_KEYS.items():
            assert key.encode() not in text, f"{tenant}'s key in {path}"
