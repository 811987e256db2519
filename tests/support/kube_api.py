"""A fake Kubernetes API server on loopback that answers ``GET /api/v1/nodes/NAME``.

For ``kafka-fetch-proxy node-zone``: plain HTTP on a port chosen at run time, nodes
given as ``{name: labels}``, a bearer token it requires (401 without, 403 for another),
and a log of the paths asked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FakeKubeApi:
    url: str
    token: str
    nodes: dict[str, dict[str, str]]
    asked: list[str] = field(default_factory=list)


@contextmanager
def fake_kube_api(nodes: dict[str, dict[str, str]], token: str = "t0ken") -> Iterator[FakeKubeApi]:
    api = FakeKubeApi("", token, nodes)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            api.asked.append(self.path)
            auth = self.headers.get("Authorization")
            prefix = "/api/v1/nodes/"
            if auth is None:
                self._send(401, {"kind": "Status", "code": 401})
            elif auth != f"Bearer {api.token}":
                self._send(403, {"kind": "Status", "code": 403, "reason": "Forbidden"})
            elif self.path.startswith(prefix) and self.path[len(prefix) :] in api.nodes:
                name = self.path[len(prefix) :]
                node = {"kind": "Node", "metadata": {"name": name, "labels": api.nodes[name]}}
                self._send(200, node)
            else:
                self._send(404, {"kind": "Status", "code": 404})

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
