"""An upstream that fails the ways real servers do, for the gateway's fault tests.

`python -m tests.flows.gateway.faulty_upstream PORT VERSION` lists VERSION on /v1/models.
A chat completion's last message content picks the reply:
- `stream-error`: a stream that starts, then carries an error event and `[DONE]` (what vLLM
  sends when generation fails midway: its create_streaming_error_response);
- `stream-garbage`: a stream that starts, then carries an HTML line as its next event;
- `not-json`, `a-list`, `nan`, `surrogate`: status 200 with an HTML page, a JSON array,
  a bare NaN in the usage, a lone UTF-16 surrogate in the content (a proxy's error page,
  a broken server, Python's json.dumps defaults);
- `slow`: a good answer after 3 s;
- anything else: a good answer, streamed when asked.
"""
from __future__ import annotations

import json
import sys
import time
from http.server import ThreadingHTTPServer

from tests.flows.gateway.upstream_handler import ScriptedUpstream

SLOW_S = 3.0


def completion(version: str, text: str) -> dict:
    return {"id": "chatcmpl-upstream", "object": "chat.completion", "created": 0, "model": version,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def chunk(version: str, delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-upstream", "object": "chat.completion.chunk", "created": 0, "model": version,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def handler(version: str) -> type[ScriptedUpstream]:
    class Handler(ScriptedUpstream):

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            mode = request["messages"][-1]["content"]
            if request.get("stream"):
                self.stream(mode)
            elif mode == "not-json":
                self.reply(b"<html><body>502 Bad Gateway</body></html>", "text/html")
            elif mode == "a-list":
                self.reply(b"[1, 2]")
            elif mode == "nan":
                self.reply(json.dumps({**completion(version, "ok"), "usage": {"prompt_tokens": float("nan")}}).encode())
            elif mode == "surrogate":
                self.reply(json.dumps(completion(version, "half an emoji: \ud83d")).encode())
            else:
                if mode == "slow":
                    time.sleep(SLOW_S)
                self.reply(json.dumps(completion(version, f"answer to {mode}")).encode())

        def stream(self, mode: str) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(chunk(version, {"role": "assistant", "content": ""}))
            self.wfile.write(chunk(version, {"content": "partial "}))
            if mode == "stream-error":
                error = {"error": {"message": "Internal server error", "type": "InternalServerError",
                                   "param": None, "code": 500}}
                self.wfile.write(f"data: {json.dumps(error)}\n\n".encode())
            elif mode == "stream-garbage":
                self.wfile.write(b"data: <html><body>502 Bad Gateway</body></html>\n\n")
            else:
                self.wfile.write(chunk(version, {}, "stop"))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    Handler.version = version
    return Handler


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler(sys.argv[2])).serve_forever()
