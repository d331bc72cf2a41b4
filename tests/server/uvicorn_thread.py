"""`serving(app)`: an ASGI app under a real uvicorn on a free port of 127.0.0.1, in a thread of the test's process
(so a test can reach the engine behind it), stopped when the block ends."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serving(app: Any, send_buffer: int | None = None, **config: Any) -> Iterator[int]:
    """The port `app` listens on; `send_buffer`: the accepted sockets' SO_SNDBUF (they inherit the listener's);
    `config`: more of uvicorn.Config's arguments."""
    listener = socket.socket()
    if send_buffer is not None:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", timeout_graceful_shutdown=5, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        listener.close()
