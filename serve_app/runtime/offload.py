"""Big request work away from the event loop: decoding and validating a large body,
rendering and tokenizing a long conversation.

An ingress replica serves every stream it holds, and its health check, from one event loop;
a request whose body takes half a second to decode would stall them all that long. So work
on a big request runs in one of a few worker threads (`off_loop`), and small requests, most
of them, stay on the loop (a thread hop costs more than their work).

A worker thread helps only where the work lets go of the GIL often: Python code does (the
interpreter hands the GIL over every few milliseconds), tokenizers' Rust encoding does (it
releases it), but one long call into a native library that keeps it does not. So the work is
also cut or bounded where it holds the GIL (and the garbage collector, which holds it for
a whole collection, waits while a worker works): strict JSON decoding calls back into Python for
each object, input items are validated a slice at a time (api/request.py), harmony renders a
message at a time (through its prompt cache), and `request_limits` bound the rest
(api/limits.py): the longest single string, the number of items and tools.
tests/server/test_hostile_input.py measures a concurrent stream's longest gap while 50,000
tools and 50,000 input items are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T")

# Above these, the work goes to a worker thread.
BIG_BODY_BYTES = 64 * 1024
BIG_HISTORY_CHARS = 64 * 1024
BIG_HISTORY_ITEMS = 256
BIG_TOOLS = 64
WORKERS = 2  # big requests run two at a time per replica; the rest wait their turn

_executor: ThreadPoolExecutor | None = None


def _workers() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="responses-serve-request")
    return _executor


async def off_loop(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in a worker thread; its exception is raised here."""
    return await asyncio.get_running_loop().run_in_executor(_workers(), functools.partial(_work, function, *args))


def _work(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` with the garbage collector paused; what it made and dropped is freed
    here, in the worker: an exception leaves without the frames (and their values) it
    passed through."""
    with _collector_paused():
        try:
            return function(*args)
        except BaseException as exc:
            exc.__context__ = exc.__cause__ = None
            raise exc.with_traceback(None) from None


# The collector runs when enough objects were made, wherever: decoding a big body or
# validating many items makes a great many, and each full collection holds the GIL while it
# walks every object of the process (~0.1-0.4 s here: the loop's longest pause in a replica
# refusing 50,000 tools). Paused while any worker works; what they drop is freed by reference
# counting as ever, and cycles wait for the next collection.
_paused = 0
_paused_lock = threading.Lock()
_was_enabled = True


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    global _paused, _was_enabled
    with _paused_lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()


async def parse_body_off_loop(body: bytes | str, parse: Callable[[Any], T]) -> T:
    """`parse(body)`: on the loop for a small body, in a worker thread for a big one."""
    return parse(body) if len(body) <= BIG_BODY_BYTES else await off_loop(parse, body)


def big_prompt(items: list[Any], tools: int) -> bool:
    """Whether rendering `items` (and `tools` tools) is big work: their number, or the size of
    everything they hold (every string of every field: an `mcp_call`'s output, a listing's
    tools, a `code_interpreter_call`'s code are rendered too)."""
    if len(items) > BIG_HISTORY_ITEMS or tools > BIG_TOOLS:
        return True
    return _size_over(items, BIG_HISTORY_CHARS)


def _size_over(value: Any, limit: int) -> bool:
    """Whether the characters of `value`'s strings, plus one per value, are over `limit`:
    walked only until they are (so in bounded time, whatever it holds)."""
    size, stack = 0, [value]
    while stack:
        node = stack.pop()
        size += len(node) if isinstance(node, str) else 1
        if size > limit:
            return True
        if isinstance(node, BaseModel):
            stack.extend(node.__dict__.values())
            stack.extend((node.__pydantic_extra__ or {}).values())
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return False
