"""API keys, tenants and quotas through Serve: the session's secured application (tests/conftest.py
SECURED_ARGS) runs two ingress replicas behind the proxy under the route prefix /api, on the
embedded store. The same scenarios as in-process (tests/server/test_auth.py, test_quotas.py)."""

from __future__ import annotations

from tests.conftest import SECURED_PREFIX, SECURED_RPM, TENANT_KEYS
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
    paths += [f"{SECURED_PREFIX}{SECURED_PREFIX}/v1/models", f"/{SECURED_PREFIX}/v1/models", "/api/v1/../../v1/models"]
    tenant_scenarios.unauthenticated_everywhere(secured_url, TENANT_KEYS["team-a"], paths)


def test_tenants_cannot_see_each_other_across_replicas(secured_url):
    tenant_scenarios.tenants_cannot_see_each_other(secured_url, TENANT_KEYS["team-a"], TENANT_KEYS["team-b"])


def test_requests_per_minute_holds_across_both_replicas(secured_url):
    tenant_scenarios.burst_within_requests_per_minute([secured_url], TENANT_KEYS["burst"], per_minute=SECURED_RPM)
    tenant_scenarios.the_sdk_retries_after_a_429(secured_url, TENANT_KEYS["burst"])


def test_max_concurrent_requests_and_max_background_refuse_the_next(secured_url):
    tenant_scenarios.max_concurrent_requests_refuses_the_next(secured_url, TENANT_KEYS["busy"], "gpt-oss-replay", limit=2)
    tenant_scenarios.max_background_refuses_the_next(secured_url, TENANT_KEYS["busy"], "gpt-oss-replay", limit=1)
