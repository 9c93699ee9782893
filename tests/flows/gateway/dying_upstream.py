"""An upstream whose server dies with a call in flight, for test_resilience.

`python -m tests.flows.gateway.dying_upstream PORT VERSION ANSWERS` lists VERSION on
/v1/models, answers ANSWERS chat completions (non-streamed, a canned reply), then exits
the whole process on the next one once its request is read, without a response byte: what
a vLLM server whose engine crashed does to the calls it holds. Later calls find nothing
listening on PORT. With a fourth argument STATUS, its answers carry that status and an
OpenAI error body instead (an overloaded server's 503).
"""
from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(version: str) -> dict:
    return {"id": "chatcmpl-upstream", "object": "chat.completion", "created": 0, "model": version,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def handler(version: str, answers: int, status: int) -> type[BaseHTTPRequestHandler]:
    left = [answers]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def reply(self, body: dict, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self.reply({"object": "list", "data": [{"id": version, "object": "model"}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            if left[0] <= 0:
                os._exit(1)  # the kernel resets or closes every connection; nothing was sent
            left[0] -= 1
            if status == 200:
                self.reply(completion(version))
            else:
                self.reply({"error": {"message": f"{version} is overloaded", "type": "server_error"}}, status)

    return Handler


def main() -> None:
    port, version, answers = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    status = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    ThreadingHTTPServer(("127.0.0.1", port), handler(version, answers, status)).serve_forever()


if __name__ == "__main__":
    main()
