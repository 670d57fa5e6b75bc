"""A batch endpoint in front of fake-gcs-server, for tests of gs:// batch deletes.

fake-gcs-server (the emulator of tests/conftest.py) answers ``POST /batch/storage/v1`` from
google-cloud-storage's `Client.batch` with an empty multipart body (no part per call), so the
client cannot read a batch's results from it. This proxy on 127.0.0.1 passes every request to
the emulator unchanged, except a batch: it splits the multipart request the real client built,
sends each call to the emulator (which enforces ``ifGenerationMatch`` with 412), and answers
one ``application/http`` part per call, as GCS does. `fail` makes calls whose object name
contains one of its strings answer `fail_status` without reaching the emulator (a failure GCS
could return per call)."""

from __future__ import annotations

import email.parser
import http.client
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BATCH_PATH = "/batch/storage/v1"


@dataclass
class BatchProxy:
    upstream: str  # the emulator's http://host:port
    url: str = ""
    fail: tuple[str, ...] = ()
    fail_status: int = 503
    batches: list[int] = field(default_factory=list)  # calls per batch request received


def _send(upstream: str, method: str, target: str, headers: dict[str, str], body: bytes):
    parsed = urllib.parse.urlsplit(upstream)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        conn.request(method, target, body=body or None, headers=headers)
        response = conn.getresponse()
        return response.status, response.reason, response.getheaders(), response.read()
    finally:
        conn.close()


def _calls(content_type: str, body: bytes) -> list[tuple[str, str, dict[str, str], bytes]]:
    """The (method, path?query, headers, body) of each call of a batch request."""
    message = email.parser.BytesParser().parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\nMIME-Version: 1.0\r\n\r\n" + body
    )
    calls = []
    for part in message.get_payload():
        raw = part.get_payload(decode=False)
        head, _, call_body = raw.replace("\r\n", "\n").partition("\n\n")
        request_line, *header_lines = head.split("\n")
        method, uri, _version = request_line.split(" ", 2)
        split = urllib.parse.urlsplit(uri)
        target = split.path + (f"?{split.query}" if split.query else "")
        headers = dict(line.split(": ", 1) for line in header_lines if line)
        calls.append((method, target, headers, call_body.encode()))
    return calls


def _handler(proxy: BatchProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "date"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            body = self._body()
            if self.path.startswith(BATCH_PATH):
                self._batch(body)
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            status, _, out, data = _send(proxy.upstream, self.command, self.path, headers, body)
            self._answer(status, out, data)

        def _batch(self, body: bytes) -> None:
            calls = _calls(self.headers["Content-Type"], body)
            proxy.batches.append(len(calls))
            boundary = "batch_proxy_boundary"
            parts = []
            for n, (method, target, headers, call_body) in enumerate(calls, start=1):
                name = urllib.parse.unquote(target)
                if any(f in name for f in proxy.fail):
                    status, reason, data = proxy.fail_status, "Injected", b"{}"
                else:
                    status, reason, _, data = _send(
                        proxy.upstream, method, target, headers, call_body
                    )
                parts.append(
                    f"--{boundary}\r\nContent-Type: application/http\r\n"
                    f"Content-ID: <response-{n}>\r\n\r\nHTTP/1.1 {status} {reason}\r\n"
                    f"Content-Type: application/json\r\n\r\n{data.decode()}\r\n"
                )
            out = ("".join(parts) + f"--{boundary}--\r\n").encode()
            self._answer(200, [("Content-Type", f"multipart/mixed; boundary={boundary}")], out)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    return Handler


@contextmanager
def batch_proxy(upstream: str) -> Iterator[BatchProxy]:
    """A BatchProxy on a free port of 127.0.0.1 in front of `upstream`, until the block ends."""
    proxy = BatchProxy(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
