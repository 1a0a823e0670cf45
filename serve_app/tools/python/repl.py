"""The interpreter inside a python-tool sandbox: a Jupyter-like REPL driven over pipes.

This file runs as a script under the sandbox's Python, never as part of the package: it uses the
standard library only (the sandbox cannot see `serve_app`). `sandbox.py` starts it as the
only program of a fresh bubblewrap sandbox, with one argument: a JSON object of settings.

Pipes (as the host sees them):
- stdin: requests, one JSON object a line: `{"op": "run", "code": ..., "sentinel": ...}` or
  `{"op": "interrupt"}` (a KeyboardInterrupt in the running cell, as Jupyter's interrupt).
- stdout: replies, one JSON object a line: `{"ready": true}` once, then per cell
  `{"status": "ok" | "error", "images": [base64 PNG, ...], "omitted_images": N}`.
- stderr: everything the cell prints (its stdout and stderr, and those of its subprocesses),
  then the request's sentinel, so the host knows where one cell's output ends.
The code can find and misuse these pipes (it runs in this process): it only garbles its own
results, which the host treats as untrusted anyway.
"""

import ast
import base64
import builtins
import contextlib
import io
import json
import linecache
import os
import queue
import resource
import signal
import sys
import threading
import time
import traceback
import warnings

# Type hints for the checker only: the names are imported under TYPE_CHECKING (as typing's, without
# importing typing into the sandbox) and every hint that uses them or a generic is quoted, so that
# no Python evaluates them. No `from __future__ import annotations` either: compile() passes a
# future import on to the cells it compiles.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, BinaryIO

# Set by the host: the process limits, applied here before any code of the model runs.
RLIMITS = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")


class Cells:
    """Runs cells in one namespace, as a notebook does; interruptible only while a cell runs."""

    def __init__(self, settings: "dict[str, Any]") -> None:
        self.settings = settings
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.count = 0
        self.in_cell = False

    def on_interrupt(self, signum: int, frame: "FrameType | None") -> None:
        if self.in_cell:
            raise KeyboardInterrupt

    def run(self, code: str) -> "tuple[str, list[str], int]":
        """Run one cell: its output goes to fd 1/2; returns the status and the figures it drew."""
        self.count += 1
        filename = f"<cell {self.count}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
        signal.signal(signal.SIGINT, self.on_interrupt)
        self.in_cell = True
        try:
            status = self.execute(code, filename)
            images, omitted = self.figures()
        finally:
            self.in_cell = False
        return status, images, omitted

    def execute(self, code: str, filename: str) -> str:
        try:
            tree = ast.parse(code, filename, "exec")
        except (SyntaxError, ValueError) as error:
            self.report(error, with_traceback=False)
            return "error"
        # The value of a last expression is shown, as in Jupyter.
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        try:
            exec(compile(tree, filename, "exec"), self.namespace)
            if isinstance(last, ast.Expr):  # None, or the expression popped above
                value = eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
                if value is not None:
                    self.namespace["_"] = value
                    print(repr(value))
        except BaseException as error:  # the cell's own failure (SystemExit and KeyboardInterrupt too) is its output
            self.report(error, with_traceback=True)
            return "error"
        return "ok"

    def report(self, error: BaseException, with_traceback: bool) -> None:
        sys.stdout.flush()
        if not with_traceback:
            print("".join(traceback.format_exception_only(type(error), error)), end="", file=sys.stderr)
            return
        report = traceback.TracebackException.from_exception(error)
        report.stack = traceback.StackSummary.from_list([frame for frame in report.stack if frame.filename != __file__])
        print("".join(report.format()), end="", file=sys.stderr)

    def figures(self) -> "tuple[list[str], int]":
        """Matplotlib figures left open by the cell, as PNG (then closed), as an inline backend does."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return [], 0
        images: list[str] = []
        omitted = 0
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            buffer = io.BytesIO()
            try:
                figure.savefig(buffer, format="png")
            except Exception as error:
                print(f"[figure {number} could not be drawn: {error!r}]", file=sys.stderr)
                continue
            finally:
                pyplot.close(figure)
            data = buffer.getvalue()
            if len(images) < self.settings["max_images"] and len(data) <= self.settings["max_image_bytes"]:
                images.append(base64.b64encode(data).decode("ascii"))
            else:
                omitted += 1
        return images, omitted


def apply_limits(limits: "dict[str, list[int]]") -> None:
    for name in RLIMITS:
        if name in limits:
            kind = getattr(resource, name)
            soft, hard = limits[name]
            _, current_hard = resource.getrlimit(kind)
            if current_hard != resource.RLIM_INFINITY:
                soft, hard = min(soft, current_hard), min(hard, current_hard)
            resource.setrlimit(kind, (soft, hard))


def flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:  # C libraries' stdio buffers (printf from an extension)
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def kill_strays() -> None:
    """Processes a cell started do not outlive it: kill every other process of this sandbox.

    Only as pid 2 of a fresh PID namespace (bubblewrap's init is 1): outside a sandbox,
    kill(-1) would reach every process of this user.
    """
    if os.getpid() != 2:
        return
    for _ in range(100):  # again while a process forked as it was being killed
        for signum in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(-1, signum)
            except ProcessLookupError:
                break
        if not any(living(pid) for pid in os.listdir("/proc") if pid.isdigit() and int(pid) > 2):
            break
        time.sleep(0.01)
    while True:  # reap this process's children: zombies count against the process limit
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def living(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"  # not a zombie its init has yet to reap
    except OSError:
        return False


def read_requests(control_in: "BinaryIO", requests: "queue.SimpleQueue[dict[str, Any]]", main_thread: int) -> None:
    for line in control_in:
        request = json.loads(line)
        if request.get("op") == "interrupt":
            signal.pthread_kill(main_thread, signal.SIGINT)
        else:
            requests.put(request)
    os._exit(0)  # the host closed the pipe: this interpreter is done


def main() -> None:
    settings = json.loads(sys.argv[1])
    apply_limits(settings["rlimits"])
    os.nice(10)  # the model's code yields the CPU to the server (and cannot take it back)
    # The pipes: requests and replies move to private descriptors; the cell's stdin is empty and
    # its stdout joins its stderr, so the host reads one stream in the order it was written.
    control_in = os.fdopen(os.dup(0), "rb")
    control_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (stdin stays open for the process's life; fd 0 is /dev/null now)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, errors="backslashreplace")
    # Figures are collected after each cell; plt.show() on the Agg backend only warns.
    warnings.filterwarnings("ignore", message=".*non-interactive, and thus cannot be shown")

    driver = os.getpid()
    cells = Cells(settings)
    signal.signal(signal.SIGINT, cells.on_interrupt)
    requests: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    threading.Thread(target=read_requests, args=(control_in, requests, threading.main_thread().ident), daemon=True).start()
    control_out.write(b'{"ready": true}\n')
    control_out.flush()
    while True:
        request = None
        try:
            request = requests.get()
            status, images, omitted = cells.run(request["code"])
        except KeyboardInterrupt:  # an interrupt that arrived just as the cell ended
            if request is None:
                continue
            status, images, omitted = "error", [], 0
        if os.getpid() != driver:  # a process the cell forked, back here: only the driver answers
            os._exit(0)
        kill_strays()
        flush_all()
        write_all(2, b"\x00" + request["sentinel"].encode("ascii") + b"\x00")
        reply = {"status": status, "images": images, "omitted_images": omitted}
        control_out.write(json.dumps(reply).encode("ascii") + b"\n")
        control_out.flush()


if __name__ == "__main__":
    main()
