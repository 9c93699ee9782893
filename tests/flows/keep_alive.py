"""Does a server answer a second request on a connection left idle for a while?

Pooled clients (httpx, the openai SDK, proxies) reuse idle connections; a server that has
closed one meanwhile resets the next request (flows/http_server.py says why it matters).
A raw socket makes the reuse certain: no pool can quietly open a new connection.
"""
from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit


def answers_after_idle(url: str, path: str, idle_s: float) -> bool:
    """GET `path` twice on one connection, `idle_s` apart; True if both are answered."""
    parts = urlsplit(url)
    request = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        for attempt in range(2):
            if attempt:
                time.sleep(idle_s)
            try:
                sock.sendall(request)
                head = _read_head(sock)
            except OSError:  # reset by the server
                return False
            if not head.startswith(b"HTTP/1.1 200"):
                return False
            _skip_body(sock, head)
    return True


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:  # closed by the server
            return b""
        data += chunk
    return data


def _skip_body(sock: socket.socket, head: bytes) -> None:
    header, _, body = head.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(4096)
