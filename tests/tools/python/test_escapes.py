"""The python tool against its attacker: code a model writes, sent to the running MCP server
through the `mcp` SDK's client, with the real sandbox. Each attack is contained, reported in
the tool result, and the server answers the next call.

The attacker's brief (what model-written code would try), one test each:
- read the host's files: a file the test created, /etc files, the project's sources, the
  server's environment (its variables, /proc/*/environ of every process it can see);
- write outside its working directory (the runtime, /, /etc, /dev, /proc/sys, the REPL);
- reach the network: the host's loopback (a listener the test opened), any other address,
  kernel sockets (netlink);
- see or signal host processes (ps, /proc);
- exhaust the host: a fork bomb, an 8 GB allocation, an endless loop (one that ignores the
  interrupt too), 100 MB of output, a full disk, a huge file;
- widen its own powers: new user namespaces, mount, ptrace, bpf, io_uring, keyrings, setuid;
- subvert the tool: speak over the control pipe, use another owner's container;
- outlive the server.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import signal
import socket
import threading
from pathlib import Path

import anyio
import psutil
import pytest
from mcp import Client, types

from serve_app.tools.python.mcp_server import INPUT_SCHEMA, META_CONTAINER, META_OWNER
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

ROOT = Path(__file__).resolve().parents[3]


def report(result: types.CallToolResult) -> dict:
    """The JSON object the attack printed last."""
    return json.loads(text(result).strip().splitlines()[-1])


async def test_the_tool_is_python_taking_only_code(tool_server: ToolServer):
    async with Client(tool_server.url) as client:
        tools = (await client.list_tools()).tools
    assert [(tool.name, tool.input_schema) for tool in tools] == [("python", INPUT_SCHEMA)]
    assert "/mnt/data" in (tools[0].description or "")
    assert "disabled" in (tools[0].description or "")


async def test_a_normal_program_output_is_exact(tool_server: ToolServer):
    code = "import sys\nprint('hello')\nprint('to stderr', file=sys.stderr)\nsys.stdout.write('no newline')\nx = [1, 2]\nx"
    result = await call(tool_server.url, code)
    assert (text(result), status(result), result.is_error) == ("hello\nto stderr\nno newline[1, 2]\n", "ok", False)
    assert container_of(result).startswith("cntr_")
    assert len(container_of(result)) == 37
    # An exception is the cell's output, as in a notebook: not a tool error.
    result = await call(tool_server.url, "y = 1\n1 / 0", container=container_of(result))
    assert (status(result), result.is_error) == ("error", False)
    assert text(result).startswith('Traceback (most recent call last):\n  File "<cell 2>", line 2, in <module>\n    1 / 0\n')
    assert text(result).endswith("\nZeroDivisionError: division by zero\n")
    assert "repl.py" not in text(result)  # the driver's own frames are not shown
    # Bytes that are not UTF-8 come back replaced; sys.exit() ends the cell, not the interpreter.
    code = "import sys\nsys.stdout.buffer.write(b'\\xff\\x00ok\\n')\nsys.stdout.flush()\nsys.exit(3)"
    result = await call(tool_server.url, code, container=container_of(result))
    assert text(result).startswith("\ufffd\x00ok\nTraceback")
    assert text(result).endswith("\nSystemExit: 3\n")
    assert text(await call(tool_server.url, "y", container=container_of(result))) == "1\n"


async def test_state_is_kept_within_a_container_and_not_across_containers(tool_server: ToolServer):
    first = await call(tool_server.url, "secret = 'mine'\nopen('/mnt/data/notes.txt', 'w').write('kept')")
    other = await call(tool_server.url, "print(repr(globals().get('secret')), __import__('os').listdir('/mnt/data'))")
    assert text(other) == "None []\n"
    assert container_of(other) != container_of(first)
    again = await call(tool_server.url, "print(secret, open('/mnt/data/notes.txt').read())", container=container_of(first))
    assert text(again) == "mine kept\n"
    assert container_of(again) == container_of(first)


async def test_another_owner_cannot_use_a_container(tool_server: ToolServer):
    mine = await call(tool_server.url, "x = 'original'", owner="tenant-a")
    stolen = await call(tool_server.url, "x = 'hijacked'\nprint(x)", owner="tenant-b", container=container_of(mine))
    never = "cntr_" + "0" * 32
    missing = await call(tool_server.url, "x = 'hijacked'", owner="tenant-b", container=never)
    assert (status(stolen), stolen.is_error) == ("not_found", True)
    # Exactly as an id that never existed: nothing tells the other owner the container is real.
    assert text(stolen).replace(container_of(mine), never) == text(missing)
    assert stolen.meta is not None
    assert META_CONTAINER not in stolen.meta
    result = await call(tool_server.url, "print(x)", owner="tenant-a", container=container_of(mine))
    assert text(result) == "original\n"
    # No owner is an owner of its own ("" ): it cannot reach tenant-a's container either.
    async with Client(tool_server.url) as client:
        anonymous = await client.call_tool("python", {"code": "print(x)"}, meta={META_CONTAINER: container_of(mine)})
    assert status(anonymous) == "not_found"


async def test_files_of_the_host_are_not_visible(tool_server: ToolServer, tmp_path: Path):
    planted = tmp_path / "planted-secret.txt"
    planted.write_text("host-only-" + tool_server.secret)
    targets = [str(planted), str(tmp_path), "/etc/hostname", "/etc/passwd", "/etc/shadow", "/home", str(ROOT / "pyproject.toml"), str(ROOT)]
    code = f"""
import json, os, sys
found = {{}}
for path in {targets!r}:
    try:
        found[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
    except OSError as error:
        found[path] = type(error).__name__
top = sorted(os.listdir('/'))
print(json.dumps({{"found": found, "top": top, "etc": sorted(os.listdir('/etc')), "prefixes": [sys.prefix, sys.base_prefix]}}))
"""
    result = await call(tool_server.url, code)
    seen = report(result)
    assert tool_server.secret not in text(result)
    # The project's tree is not there (only its .venv, when that is the sandbox's Python).
    assert seen["found"].pop(str(ROOT)) in ("FileNotFoundError", [".venv"])
    for path in targets[:-1]:
        assert seen["found"][path] in ("FileNotFoundError", "PermissionError"), (path, seen["found"][path])
    # The whole view: /usr, the runtime, the sandbox's own mounts; of /etc only what the runtime reads.
    runtime_tops = {prefix.split("/")[1] for prefix in seen["prefixes"]}
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "proc", "dev", "tmp", "mnt"} | runtime_tops
    assert set(seen["top"]) <= allowed
    assert set(seen["etc"]) <= {"ld.so.cache", "fonts"}
    await assert_still_serving(tool_server.url)


async def test_writing_outside_the_working_directory_fails(tool_server: ToolServer):
    token = "written-" + os.urandom(6).hex()
    code = f"""
import json, os, sys
outcome = {{}}
for path in ['/{token}', '/etc/{token}', '/usr/{token}', sys.prefix + '/{token}', sys.base_prefix + '/{token}',
             '/opt/responses-serve/repl.py', '/dev/{token}', '/proc/sys/kernel/hostname', '/mnt/data/{token}', '/tmp/{token}']:
    try:
        with open(path, 'w') as file:
            file.write('x')
        outcome[path] = 'written'
    except OSError as error:
        outcome[path] = type(error).__name__
print(json.dumps(outcome))
"""
    result = await call(tool_server.url, code)
    outcome = report(result)
    written = {path for path, what in outcome.items() if what == "written"}
    assert written == {f"/mnt/data/{token}", f"/tmp/{token}"}, outcome
    # What it wrote lives in the sandbox only: nothing of it on the host.
    assert not any(map(os.path.lexists, [f"/tmp/{token}", f"/{token}", f"/mnt/data/{token}"]))
    await assert_still_serving(tool_server.url)


async def test_the_network_is_unreachable_even_the_hosts_loopback(tool_server: ToolServer):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = f"""
import json, socket
outcome = {{}}
for address in [('127.0.0.1', {port}), ('10.255.255.1', 80), ('1.1.1.1', 443)]:
    try:
        socket.create_connection(address, timeout=2).close()
        outcome[str(address)] = 'connected'
    except OSError as error:
        outcome[str(address)] = type(error).__name__
try:
    socket.socket(16, socket.SOCK_RAW)  # AF_NETLINK: the kernel's own sockets
    outcome['netlink'] = 'opened'
except OSError as error:
    outcome['netlink'] = error.errno
outcome['interfaces'] = [line.split(':')[0].strip() for line in open('/proc/net/dev').read().splitlines()[2:]]
print(json.dumps(outcome))
"""
    try:
        result = await call(tool_server.url, code)
    finally:
        stop.set()
        thread.join()
        listener.close()
    outcome = report(result)
    assert accepted == []
    assert outcome[str(("127.0.0.1", port))] == "ConnectionRefusedError"  # the sandbox's own, empty loopback
    assert outcome[str(("10.255.255.1", 80))] == "OSError"
    assert outcome[str(("1.1.1.1", 443))] == "OSError"  # no route
    assert outcome["netlink"] == 97  # EAFNOSUPPORT, by the seccomp filter
    assert outcome["interfaces"] == ["lo"]
    await assert_still_serving(tool_server.url)


async def test_the_servers_environment_is_not_visible(tool_server: ToolServer):
    code = """
import json, os
seen = {'environ': dict(os.environ), 'processes': {}}
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            seen['processes'][pid] = [open(f'/proc/{pid}/{name}', 'rb').read().decode(errors='replace') for name in ('environ', 'cmdline')]
        except OSError as error:
            seen['processes'][pid] = type(error).__name__
print(json.dumps(seen))
"""
    result = await call(tool_server.url, code)
    seen = report(result)
    assert tool_server.secret not in text(result)
    assert set(seen["environ"]) == {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "PWD", "MPLBACKEND", "MPLCONFIGDIR",
        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
    }  # fmt: skip
    # Nor its working directory, nor this test's paths (bwrap's own init is the other process).
    assert str(ROOT) not in json.dumps(seen["processes"]).replace(str(ROOT / ".venv"), "")
    await assert_still_serving(tool_server.url)


async def test_host_processes_are_not_visible(tool_server: ToolServer):
    code = """
import json, os, subprocess
pids = sorted(int(pid) for pid in os.listdir('/proc') if pid.isdigit())
ps = subprocess.run(['ps', '-eo', 'pid,comm'], capture_output=True, text=True).stdout
print(json.dumps({'pids': pids, 'ps': ps, 'me': os.getpid()}))
"""
    seen = report(await call(tool_server.url, code))
    # bwrap's init (1) and the interpreter (2), and ps while it ran: nothing of the host.
    assert seen["me"] == 2
    assert seen["pids"] == [1, 2]
    commands = [line.split(maxsplit=1)[1] for line in seen["ps"].strip().splitlines()[1:]]
    assert commands[:2] == ["bwrap", "python"], seen["ps"]
    assert len(commands) == 3, seen["ps"]
    await assert_still_serving(tool_server.url)


async def test_a_fork_bomb_is_contained(tool_server: ToolServer):
    limit = int(SERVER_OPTIONS["--max-processes"])
    code = """
import os, time
forks = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        forks += 1
except OSError as error:
    print('stopped after', forks, 'forks:', error)
"""
    result = await call(tool_server.url, code)
    assert status(result) == "ok"
    assert "Resource temporarily unavailable" in text(result)
    assert int(text(result).split()[2]) < limit
    # The classic one: every child forks too. Contained the same way; the children are gone after the cell.
    result = await call(tool_server.url, "import os\nwhile True:\n    os.fork()", container=container_of(result))
    assert status(result) in ("error", "timeout")
    assert "BlockingIOError" in text(result)
    pids = await call(
        tool_server.url, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", container=container_of(result)
    )
    assert text(pids) == "[1, 2]\n"
    # Threads count too.
    code = "import threading, time\nthreads = 0\ntry:\n    while True:\n        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        threads += 1\nexcept RuntimeError as error:\n    print(threads < 24, error)"
    result = await call(tool_server.url, code, container=container_of(result))
    assert text(result) == "True can't start new thread\n"
    await assert_still_serving(tool_server.url)


async def test_an_8_gb_allocation_fails_with_memory_error(tool_server: ToolServer):
    result = await call(tool_server.url, "kept = 'state'\nhuge = bytearray(8 * 1024 ** 3)")
    assert (status(result), result.is_error) == ("error", False)
    assert text(result).rstrip().endswith("MemoryError")
    numpy = await call(tool_server.url, "import numpy as np\nnp.ones(2 ** 30)", container=container_of(result))
    assert "Unable to allocate 8.00 GiB" in text(numpy)
    assert text(await call(tool_server.url, "print(kept)", container=container_of(result))) == "state\n"


async def test_a_full_disk_and_a_huge_file_are_refused(tool_server: ToolServer):
    code = """
import json
outcome = {}
try:
    with open('/mnt/data/huge', 'wb') as file:
        file.write(b'x' * (9 * 1024 * 1024))
except OSError as error:
    outcome['file'] = error.strerror
for i in range(4):
    try:
        with open(f'/mnt/data/part{i}', 'wb') as file:
            file.write(b'x' * (7 * 1024 * 1024))
    except OSError as error:
        outcome['disk'] = error.strerror
print(json.dumps(outcome))
"""
    outcome = report(await call(tool_server.url, code))
    assert outcome == {"file": "File too large", "disk": "No space left on device"}
    await assert_still_serving(tool_server.url)


async def test_an_endless_loop_is_interrupted_and_the_state_kept(impatient_server: ToolServer):
    first = await call(impatient_server.url, "x = 1")
    result = await call(impatient_server.url, "while True:\n    x += 1", container=container_of(first))
    assert (status(result), result.is_error) == ("timeout", True)
    assert "KeyboardInterrupt" in text(result)
    assert text(result).endswith("[Execution timed out after 3 s and was interrupted; the interpreter's state is kept.]")
    counted = await call(impatient_server.url, "x > 1", container=container_of(first))
    assert text(counted) == "True\n"


async def test_a_loop_that_ignores_the_interrupt_is_killed(impatient_server: ToolServer):
    first = await call(impatient_server.url, "x = 1\nopen('/mnt/data/f', 'w').close()")
    pids_before = impatient_server.sandbox_pids()
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    result = await call(impatient_server.url, code, container=container_of(first))
    assert (status(result), result.is_error) == ("timeout", True)
    assert text(result) == (
        "[Execution timed out after 3 s and did not stop when interrupted; the interpreter was restarted: "
        "variables are lost, and files in /mnt/data too]"
    )
    assert pids_before - impatient_server.sandbox_pids()  # that sandbox's processes are gone
    # The same container goes on, fresh.
    again = await call(
        impatient_server.url, "print(globals().get('x'), __import__('os').listdir('/mnt/data'))", container=container_of(first)
    )
    assert (text(again), container_of(again)) == ("None []\n", container_of(first))


async def test_100_mb_of_output_is_truncated(tool_server: ToolServer):
    limit = int(SERVER_OPTIONS["--max-output-bytes"])
    result = await call(tool_server.url, "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\nprint('end')")
    dropped = 100_000_000 + len("end\n") - limit
    assert (status(result), result.is_error) == ("ok", False)
    assert text(result) == "x" * limit + f"\n[Output truncated: {dropped} more bytes not shown; the limit is {limit} bytes.]"
    await assert_still_serving(tool_server.url, container=container_of(result))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers of x86_64")
async def test_kernel_interfaces_are_denied_and_ordinary_work_allowed(tool_server: ToolServer):
    code = """
import ctypes, json, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(number, *args):
    result = libc.syscall(number, *args)
    return 0 if result >= 0 else ctypes.get_errno()
outcome = {
    'unshare_user': errno_of(272, 0x10000000),
    'mount': errno_of(165, b'none', b'/tmp', b'tmpfs', 0, None),
    'ptrace': errno_of(101, 0, 0, 0, 0),
    'bpf': errno_of(321, 0, 0, 0),
    'io_uring_setup': errno_of(425, 8, 0),
    'keyctl': errno_of(250, 0, 0, 0),
    'perf_event_open': errno_of(298, 0, 0, -1, -1, 0),
    'userfaultfd': errno_of(323, 0),
}
try:
    os.setuid(0)
    outcome['setuid'] = 0
except OSError as error:
    outcome['setuid'] = error.errno
outcome['subprocess'] = subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout
box = []
thread = threading.Thread(target=lambda: box.append(sum(range(10))))
thread.start(); thread.join()
outcome['thread'] = box
print(json.dumps(outcome))
"""
    outcome = report(await call(tool_server.url, code))
    EPERM, EINVAL = 1, 22
    denied = dict.fromkeys(("unshare_user", "mount", "ptrace", "bpf", "io_uring_setup", "keyctl", "perf_event_open", "userfaultfd"), EPERM)
    # uid 0 does not even exist in the sandbox's user namespace.
    assert outcome == {**denied, "setuid": EINVAL, "subprocess": "hi\n", "thread": [45]}


async def test_talking_over_the_control_pipe_only_breaks_its_own_result(tool_server: ToolServer):
    first = await call(tool_server.url, "x = 1")
    code = """
import os, stat
for fd in map(int, os.listdir('/proc/self/fd')):
    if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
        try:
            os.write(fd, b'{"status": "ok", "images": ["forged"' + b'x' * 100 + b'\\n')
        except OSError:
            pass
"""
    result = await call(tool_server.url, code, container=container_of(first))
    assert (status(result), result.is_error) == ("crashed", True)
    assert "reply was unreadable" in text(result)
    await assert_still_serving(tool_server.url, container=container_of(first))


async def test_bad_arguments_are_refused_and_nothing_runs(tool_server: ToolServer):
    async with Client(tool_server.url) as client:
        for arguments in ({"code": 5}, {"code": "print(1)", "extra": 1}, {}):
            result = await client.call_tool("python", arguments, meta={META_OWNER: "attacker"})
            assert (status(result), result.is_error) == ("invalid", True)
        result = await client.call_tool("python", {"code": "1"}, meta={META_OWNER: "attacker", META_CONTAINER: "cntr_../../etc"})
        assert text(result) == "no container with that id: it expired, was deleted or freed for others, or never existed"
        result = await client.call_tool("python", {"code": "#" * (1024 * 1024 + 1)}, meta={META_OWNER: "attacker"})
        assert (status(result), result.is_error) == ("invalid", True)


async def test_figures_come_back_as_png_images(tool_server: ToolServer):
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()\nprint('drawn')"
    result = await call(tool_server.url, code)
    assert text(result) == "drawn\n"
    images = [block for block in result.content if isinstance(block, types.ImageContent)]
    assert len(images) == 1
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
    # Shown once: the figure was closed.
    again = await call(tool_server.url, "import matplotlib.pyplot as plt\nplt.get_fignums()", container=container_of(result))
    assert text(again) == "[]\n"
    assert len(again.content) == 1
    # At most 8 figures a call; the others are said to be left out.
    many = await call(tool_server.url, "for i in range(10):\n    plt.figure()\n    plt.plot([i])", container=container_of(result))
    assert len([block for block in many.content if isinstance(block, types.ImageContent)]) == 8
    assert text(many) == "[2 figure(s) not returned: more than 8 or larger than 2097152 bytes]"


async def test_concurrent_calls_do_not_wait_for_each_other(tool_server: ToolServer):
    finished: list[str] = []

    async def slow() -> None:
        result = await call(tool_server.url, "import time\ntime.sleep(2)\nprint('slow')")
        finished.append(text(result))

    async with anyio.create_task_group() as group:
        group.start_soon(slow)
        await anyio.sleep(0.3)
        quick = await call(tool_server.url, "print('quick')")
        async with Client(tool_server.url) as client:
            listed = await client.list_tools()
        # Answered while the other call still runs: neither the event loop nor the server waits on it.
        assert (text(quick), finished, [tool.name for tool in listed.tools]) == ("quick\n", [], ["python"])
    assert finished == ["slow\n"]


async def test_the_sandboxes_die_with_the_server():
    server = start_server("unused", SERVER_OPTIONS)
    try:
        result = await call(server.url, "x = 1")
        assert status(result) == "ok"
        sandbox = [psutil.Process(pid) for pid in server.sandbox_pids()]
        assert sandbox
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        _, alive = psutil.wait_procs(sandbox, timeout=10)
        assert alive == []
    finally:
        if server.process.poll() is None:
            stop_server(server)
