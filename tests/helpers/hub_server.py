"""A stand-in for the Hugging Face Hub at the network's boundary: a local HTTP server that answers every request
with 404 and records it. A process given `online_env(server)` talks to it instead of the Hub (`HF_ENDPOINT`), so a
test can see every Hub request a command makes."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Recorder(BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_POST = _refuse

    def log_message(self, *args) -> None:  # the requests are recorded, not printed
        pass


@contextmanager
def recording_hub() -> Iterator[ThreadingHTTPServer]:
    """A running stand-in Hub; its `requests` lists each request as 'METHOD PATH'."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def online_env(env: dict, server: ThreadingHTTPServer) -> dict:
    """`env` with the Hub reachable, at `server`: not offline, its address as the endpoint."""
    online = {name: value for name, value in env.items() if name not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                                       "HF_DATASETS_OFFLINE")}  # fmt: skip
    return online | {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}
