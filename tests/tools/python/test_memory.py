"""The memory limit bounds a sandbox's processes together, not only each one: rlimits are per
process, so a program that forks would otherwise hold `max_processes × memory_mb`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tools.python.conftest import (
    SERVER_OPTIONS,
    ToolServer,
    assert_still_serving,
    call,
    container_of,
    start_server,
    status,
    stop_server,
    text,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # sandboxes that take seconds to start: not in make test-fast

MEMORY_MB = 64  # small: the attack stays cheap on a shared machine

# Eight children, each touching a quarter of the limit: each is far under its own RLIMIT_AS,
# together they hold twice the limit.
FORKS = f"""
import os, time
size = {MEMORY_MB} * 1024 * 1024 // 4
children = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        block = bytearray(size)
        for i in range(0, size, 4096):
            block[i] = 1
        time.sleep(3)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print('the children ended')
"""


@pytest.fixture(scope="module")
def small_server() -> Iterator[ToolServer]:
    server = start_server("unused", SERVER_OPTIONS | {"--memory-mb": str(MEMORY_MB)})
    yield server
    stop_server(server)


async def test_forked_children_together_over_the_limit_are_killed(small_server: ToolServer):
    first = await call(small_server.url, "kept = 'state'")
    result = await call(small_server.url, FORKS, container=container_of(first))
    assert (status(result), result.is_error) == ("crashed", True)
    assert text(result).startswith("[The sandbox's processes held ")
    assert text(result).endswith(
        f"MiB together, more than the memory limit of {MEMORY_MB} MiB, and were killed; the interpreter was restarted: "
        "variables are lost, and files in /mnt/data too]"
    )
    # The same container goes on with a fresh interpreter; a normal program's output is exact.
    again = await call(small_server.url, "print(globals().get('kept'))", container=container_of(first))
    assert (text(again), status(again), container_of(again)) == ("None\n", "ok", container_of(first))
    await assert_still_serving(small_server.url)


async def test_shared_memory_of_forks_counts_once(small_server: ToolServer):
    # A parent holding a third of the limit forks eight children that only read it: their
    # resident sizes add up to three times the limit, the memory they hold to one third.
    code = f"""
import os
block = bytearray({MEMORY_MB} * 1024 * 1024 // 3)
for i in range(0, len(block), 4096):
    block[i] = 1
children = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        import time
        total = sum(block[i] for i in range(0, len(block), 4096))
        time.sleep(1)
        os._exit(0 if total else 1)
    children.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
"""
    result = await call(small_server.url, code)
    assert (text(result), status(result)) == ("[0, 0, 0, 0, 0, 0, 0, 0]\n", "ok")
