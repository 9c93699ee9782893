"""An upstream slow to answer a stream, for the gateway's client-gone-early test.

`python -m tests.flows.gateway.slow_upstream PORT VERSION HEAD_DELAY_S CHUNKS` lists
VERSION on /v1/models; a streamed chat completion gets its response head only after
HEAD_DELAY_S, then CHUNKS content chunks 0.25 s apart, a final chunk with usage and
[DONE]: a busy server's time to first byte, then a long answer. GET /stats says how many
streams it finished and how many the gateway cut (the connection closed mid-stream).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chunk(version: str, delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    body = {"id": "chatcmpl-upstream", "object": "chat.completion.chunk", "created": 0, "model": version,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


def handler(version: str, head_delay_s: float, chunks: int) -> type[BaseHTTPRequestHandler]:
    stats, lock = {"finished": 0, "cut": 0}, threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/stats":
                with lock:
                    self.reply(dict(stats))
            else:
                self.reply({"object": "list", "data": [{"id": version, "object": "model"}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            time.sleep(head_delay_s)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            try:
                self.wfile.write(chunk(version, {"role": "assistant", "content": ""}))
                for k in range(chunks):
                    time.sleep(0.25)
                    self.wfile.write(chunk(version, {"content": f"{k} "}))
                    self.wfile.flush()
                self.wfile.write(chunk(version, {}, "stop", {"prompt_tokens": 2, "completion_tokens": chunks,
                                                            "total_tokens": chunks + 2}))
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except OSError:
                with lock:
                    stats["cut"] += 1
                return
            with lock:
                stats["finished"] += 1
            self.close_connection = True

    return Handler


if __name__ == "__main__":
    port, version, delay, count = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    ThreadingHTTPServer(("127.0.0.1", port), handler(version, delay, count)).serve_forever()
