"""Serve's HAProxy against a client that sends its request headers a byte now and then. Serve's
config has no `timeout http-request`, so such a client held its connection for `timeout
client` (an hour) — before any key is checked: 4,096 of them (Serve's `maxconn`) took every
connection of the endpoint. The wrapper (deployments/haproxy.py) adds the timeout."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from pathlib import Path

import pytest

from deployments import haproxy
from serve_app.config.cluster import haproxy_installed_path
from tests.deployments.test_haproxy import port_taken
from tests.support.servers import free_port, wait_until

# As Serve writes it: no `timeout http-request`, an hour for a client.
SERVE_LIKE = """global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 3600s
    timeout server 3600s
frontend serve
    bind 127.0.0.1:{port}
    default_backend app
backend app
    server app 127.0.0.1:{backend}
"""


@pytest.mark.slow
def test_a_client_that_never_finishes_its_headers_is_dropped(tmp_path):
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    original = SERVE_LIKE.format(port=port, backend=free_port())
    config.write_text(original)
    env = {**os.environ, "RESPONSES_SERVE_HTTP_REQUEST_TIMEOUT_S": "2"}
    process = subprocess.Popen([haproxy_installed_path(), "-db", "-f", str(config)], env=env, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: port_taken(port), timeout_s=20)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as client:  # a bound for a hang
            client.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bear")  # and nothing more
            answer = client.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert config.read_text() == original  # Serve's file is left as Serve wrote it
    finally:
        process.kill()
        process.wait()


def test_the_timeout_goes_into_each_defaults_section_of_a_copy(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text("global\n    maxconn 10\ndefaults\n    mode http\ndefaults named # a second one\n    mode http\nfrontend f\n")
    args = haproxy.with_request_timeout(["-db", "-f", str(config), "-sf", "123"], timeout_s=7)
    assert args[:2] == ["-db", "-f"]
    assert args[3:] == ["-sf", "123"]
    assert args[2] != str(config)
    patched = Path(args[2]).read_text()
    assert patched.count("    timeout http-request 7s\n") == 2
    assert patched.replace("    timeout http-request 7s\n", "") == config.read_text()  # nothing else changed
    already = tmp_path / "own.cfg"
    already.write_text("defaults\n    timeout http-request 5s\n")
    assert haproxy.with_request_timeout(["-f", str(already)]) == ["-f", str(already)]
    with contextlib.suppress(FileNotFoundError):
        (tmp_path / "missing.cfg").unlink()
    assert haproxy.with_request_timeout(["-f", str(tmp_path / "missing.cfg")]) == ["-f", str(tmp_path / "missing.cfg")]
