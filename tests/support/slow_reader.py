"""A client that reads an HTTP response slowly: a small receive buffer, reads of a few bytes
at a time with pauses between them, so the server's writes block and its stream backs up
(what a client on a slow link, or one busy with its own work, does to a server)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import h11


def read_slowly(url: str, body: dict[str, Any], sizes: list[int], pauses_s: list[float]) -> bytes:
    """POST `body` (JSON) to `url`; the response body, read in pieces of `sizes` bytes (in
    turn) with `pauses_s` between reads (in turn)."""
    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    payload = json.dumps(body).encode()
    connection = h11.Connection(h11.CLIENT)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connecting: the window it offers
        sock.settimeout(60)
        sock.connect((host, port))
        headers = [("host", f"{host}:{port}"), ("content-type", "application/json"), ("content-length", str(len(payload)))]
        sock.sendall(connection.send(h11.Request(method="POST", target=where.path, headers=headers)))
        sock.sendall(connection.send(h11.Data(data=payload)))
        sock.sendall(connection.send(h11.EndOfMessage()))
        received, reads = bytearray(), 0
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                time.sleep(pauses_s[reads % len(pauses_s)])
                connection.receive_data(sock.recv(sizes[reads % len(sizes)]))
                reads += 1
            elif isinstance(event, h11.Response):
                if event.status_code != 200:
                    raise AssertionError(f"status {event.status_code}")
            elif isinstance(event, h11.Data):
                received += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return bytes(received)


def sse_data(stream: bytes) -> list[str]:
    """The `data:` of each event of a server-sent event stream (comments skipped)."""
    frames = stream.decode().split("\n\n")
    return [line.removeprefix("data: ") for frame in frames for line in frame.splitlines() if line.startswith("data: ")]
