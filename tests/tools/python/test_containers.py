"""The container manager without MCP (what a Ray Serve deployment would wrap), with the real
sandbox: expiry kills the interpreter (its files live in the sandbox's tmpfs, gone with it), the
limits on containers hold, a cancelled call leaves no cell running, and the event loop keeps
turning while sandboxes run. Also the output reader on every chunking of a stream."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import secrets

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.tools.python.containers import ContainerError, ContainerLimits, ContainerManager
from serve_app.tools.python.sandbox import Runtime, SandboxError, SandboxLimits, _Output

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return asyncio.run(Runtime.discover())


def sandbox_processes(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


@pytest.mark.slow
async def test_expiry_removes_the_interpreter_and_its_files(runtime: Runtime):
    async with ContainerManager(runtime, SandboxLimits(), ContainerLimits(ttl_s=0.5)) as manager:
        container, result = await manager.run("tenant", new_id(), "open('/mnt/data/kept', 'w').write('x')\nvalue = 1", create=True)
        assert result.status == "ok"
        pid = manager.interpreter_pid("tenant", container)
        assert pid is not None
        processes = sandbox_processes(pid)
        assert len(processes) >= 3  # bwrap(s) and the interpreter
        # The reaper removes it once idle past the TTL; its processes (and with them its tmpfs) are gone.
        for _ in range(200):
            if not manager.owned("tenant"):
                break
            await asyncio.sleep(0.05)
        assert manager.owned("tenant") == []
        _, alive = psutil.wait_procs(processes, timeout=10)
        assert alive == []
        with pytest.raises(ContainerError) as missing:
            await manager.run("tenant", container, "value")
        assert missing.value.reason == "not_found"


@pytest.mark.slow
async def test_delete_kills_at_once_and_only_for_the_owner(runtime: Runtime):
    async with ContainerManager(runtime) as manager:
        container, _ = await manager.run("tenant", new_id(), "x = 1", create=True)
        pid = manager.interpreter_pid("tenant", container)
        assert pid is not None
        assert manager.interpreter_pid("other", container) is None
        processes = sandbox_processes(pid)
        assert await manager.delete("other", container) is False
        assert manager.owned("tenant") == [container]
        assert await manager.delete("tenant", container) is True
        _, alive = psutil.wait_procs(processes, timeout=10)
        assert alive == []
        assert manager.owned("tenant") == []


def new_id() -> str:
    return "cntr_" + secrets.token_hex(16)


SMALL = SandboxLimits(memory_mb=256, disk_mb=16)  # 256 + 3 × 16 = 304 MiB a sandbox


def test_the_number_of_containers_follows_from_the_memory_budget(runtime: Runtime):
    assert SMALL.footprint_mb == 304
    assert ContainerManager(runtime, SMALL, ContainerLimits(memory_budget_mb=3 * 304 + 303)).max_containers == 3
    defaults = ContainerManager(runtime)
    assert defaults.max_containers == (8 * 1024 - 1024) // (1024 + 3 * 128) == 5
    with pytest.raises(SandboxError, match="holds no sandbox"):
        ContainerManager(runtime, SMALL, ContainerLimits(memory_budget_mb=303))


async def test_a_call_without_a_container_runs_in_one_that_ends_with_it(runtime: Runtime):
    async with ContainerManager(runtime, SMALL, ContainerLimits(memory_budget_mb=304)) as manager:
        for n in range(3):  # one container's room is enough for any number of calls in a row
            container, result = await manager.run("tenant", None, f"x = {n}\nprint(globals().get('y'), x)\ny = 1")
            assert (container, result.status, result.output) == (None, "ok", f"None {n}\n")
            assert manager.owned("tenant") == []


@pytest.mark.slow
async def test_a_one_shot_calls_notes_promise_no_state(runtime: Runtime):
    """A one-shot call that times out or crashes is not told its state is kept, or lost to a
    restart: it has no next call."""
    async with ContainerManager(runtime, SMALL.model_copy(update={"timeout_s": 1.0})) as manager:
        _, endless = await manager.run("tenant", None, "while True:\n    pass")
        _, died = await manager.run("tenant", None, "import os\nos._exit(3)")
        kept = new_id()
        _, endless_kept = await manager.run("tenant", kept, "while True:\n    pass", create=True)
    assert (endless.status, endless.note) == ("timeout", "[Execution timed out after 1 s and was interrupted.]")
    assert (died.status, died.note) == ("crashed", "[The Python process ended (exit status 3).]")
    assert endless_kept.note == "[Execution timed out after 1 s and was interrupted; the interpreter's state is kept.]"


async def test_a_full_server_makes_room_fairly(runtime: Runtime):
    """Three containers' room: an owner alone may take it all; a newcomer takes the least
    recently used container of the owner that holds the most; balanced owners keep theirs."""
    async with ContainerManager(runtime, SMALL, ContainerLimits(memory_budget_mb=3 * 304)) as manager:
        a = [new_id() for _ in range(3)]
        for container in a:
            await manager.run("a", container, "x = 1", create=True)
        await manager.run("a", a[0], "x")  # a[1] is now a's least recently used
        assert sorted(manager.owned("a")) == sorted(a)
        b = new_id()
        await manager.run("b", b, "1", create=True)
        assert sorted(manager.owned("a")) == sorted([a[0], a[2]])
        with pytest.raises(ContainerError) as gone:
            await manager.run("a", a[1], "x")
        assert gone.value.reason == "not_found"
        assert "freed for others" in str(gone.value)
        # b (1) asks for another while a holds 2: b replaces its own rather than swap with a.
        b2 = new_id()
        await manager.run("b", b2, "1", create=True)
        assert (sorted(manager.owned("a")), manager.owned("b")) == (sorted([a[0], a[2]]), [b2])
        # c (0) against a (2): a gives its least recently used.
        c = new_id()
        await manager.run("c", c, "1", create=True)
        assert (manager.owned("a"), manager.owned("b"), manager.owned("c")) == ([a[0]], [b2], [c])
        # d (0) against three owners of one each: nothing to take fairly, and a one-shot call
        # needs room too.
        for container in (new_id(), None):
            with pytest.raises(ContainerError) as refused:
                await manager.run("d", container, "1", create=container is not None)
            assert refused.value.reason == "limit"
            assert "as many as its memory allows" in str(refused.value)
        assert manager.owned("d") == []
        assert len(manager.owned("a") + manager.owned("b") + manager.owned("c")) == 3


@pytest.mark.slow
async def test_a_container_in_use_is_never_taken(runtime: Runtime):
    async with ContainerManager(runtime, SMALL, ContainerLimits(memory_budget_mb=304)) as manager:
        running = asyncio.create_task(manager.run("a", None, "import time\ntime.sleep(2)\nprint('kept')"))
        for _ in range(200):
            if manager.owned("a"):
                break
            await asyncio.sleep(0.05)
        with pytest.raises(ContainerError) as refused:
            await manager.run("b", None, "1")
        assert refused.value.reason == "limit"
        _, result = await running
        assert result.output == "kept\n"
        _, result = await manager.run("b", None, "print('now')")
        assert result.output == "now\n"


@pytest.mark.slow
async def test_a_cancelled_call_kills_its_cell(runtime: Runtime):
    async with ContainerManager(runtime) as manager:
        container, _ = await manager.run("tenant", new_id(), "x = 1", create=True)
        pid = manager.interpreter_pid("tenant", container)
        assert pid is not None
        processes = sandbox_processes(pid)
        call = asyncio.create_task(manager.run("tenant", container, "import time\ntime.sleep(60)"))
        await asyncio.sleep(0.5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        _, alive = psutil.wait_procs(processes, timeout=10)
        assert alive == []
        # The container goes on with a fresh interpreter.
        _, result = await manager.run("tenant", container, "print(globals().get('x'))")
        assert result.output == "None\n"


@pytest.mark.slow
async def test_the_event_loop_turns_while_cells_run(runtime: Runtime):
    async with ContainerManager(runtime, SandboxLimits(timeout_s=2)) as manager:
        endless = asyncio.create_task(manager.run("tenant", None, "while True:\n    pass"))
        _, quick = await manager.run("tenant", None, "import time\ntime.sleep(0.5)\nprint('done')")
        # The other container's call went start to end while the endless loop still ran.
        assert (quick.output, endless.done()) == ("done\n", False)
        _, result = await endless
    assert result.status == "timeout"


@pytest.mark.slow
async def test_calls_on_one_container_run_one_after_the_other(runtime: Runtime):
    async with ContainerManager(runtime) as manager:
        container, _ = await manager.run("tenant", new_id(), "order = []", create=True)
        first = asyncio.create_task(manager.run("tenant", container, "import time\ntime.sleep(0.5)\norder.append('first')"))
        await asyncio.sleep(0.1)
        _, second = await manager.run("tenant", container, "order.append('second')\norder")
        await first
    assert second.output == "['first', 'second']\n"


async def test_the_single_bwrap_path_of_a_non_root_server(runtime: Runtime):
    """As any user but root one bwrap builds the view and the namespaces; as root it runs too
    (without RLIMIT_NPROC, which the kernel never applies to uid 0): its view is the same."""
    single = dataclasses.replace(runtime, sandbox_uid=None)
    async with ContainerManager(single) as manager:
        _, result = await manager.run("tenant", None, "import os, sys\nprint(os.getuid(), sorted(os.listdir('/etc')), os.environ['HOME'])")
    assert result.output == "1000 ['fonts', 'ld.so.cache'] /tmp\n"


class _Chunks:
    def __init__(self, chunks: list[bytes]):
        self.chunks = list(chunks)

    async def read(self, n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


@given(
    output=st.binary(max_size=300),
    after=st.binary(max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    limit=st.integers(min_value=1, max_value=400),
)
def test_the_output_is_cut_at_the_sentinel_for_every_chunking(output: bytes, after: bytes, cuts: list[int], limit: int):
    sentinel = b"\x00" + b"ab12" * 8 + b"\x00"
    stream = output + sentinel + after
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    chunks = [stream[start:end] for start, end in itertools.pairwise(points) if end > start]
    reader = _Output(limit, sentinel, b"")
    assert asyncio.run(reader.read_until_sentinel(_Chunks(chunks))) is True  # type: ignore[arg-type]
    assert bytes(reader.kept) == output[:limit]
    assert reader.dropped == max(0, len(output) - limit)
    assert after.startswith(reader.after)  # what came with the sentinel, kept for the next cell


async def test_without_the_user_namespace_limit_file_the_filter_still_denies_namespaces(runtime: Runtime, monkeypatch, tmp_path):
    """gVisor has no /proc/sys/user/max_user_namespaces, which bwrap's --disable-userns needs:
    there the sandbox starts without it, and the seccomp filter alone keeps the code from
    making a user namespace."""
    from serve_app.tools.python import sandbox

    monkeypatch.setattr(sandbox, "USERNS_LIMIT", tmp_path / "absent")
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x10000000), ctypes.get_errno())"
    async with ContainerManager(runtime) as manager:
        _, result = await manager.run("tenant", None, code)
    assert (result.status, result.output) == ("ok", "-1 1\n")  # EPERM
