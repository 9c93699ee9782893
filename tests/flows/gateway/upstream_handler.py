"""The HTTP side the tests' scripted upstreams share (faulty_upstream.py, vllm_like_upstream.py):
HTTP/1.1 replies with their length, `/v1/models` naming the served version, no access log."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class ScriptedUpstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    version = ""  # set by each upstream's handler(version)

    def log_message(self, *args) -> None:
        pass

    def reply(self, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.reply(json.dumps({"object": "list", "data": [{"id": self.version, "object": "model"}]}).encode())
