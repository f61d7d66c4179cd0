"""A local statmt.org mirror over HTTP: a threaded server on 127.0.0.1 that honours Range and
If-Range, can drop a connection part-way, answer 503 or ask for basic auth, and records every
request."""

from __future__ import annotations

import base64
import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class MirrorServer:
    """Serves ``root`` over HTTP with Range support; records (path, Range) of every request."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self.drop_after: dict[str, int] = {}
        """path -> bytes sent before the connection is dropped (once)."""
        self.ignore_range = False
        self.replace_after_drop: dict[str, bytes] = {}
        """path -> new content written right after a drop (the file changes upstream)."""
        self.unavailable: dict[str, int] = {}
        """path -> how many more requests get HTTP 503."""
        self.auth: tuple[str, str] | None = None
        """(user, password) that every request must send as HTTP basic auth, else 401."""
        self.refused: list[str] = []
        """Paths asked for without the right credentials."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = unquote(urlsplit(self.path).path).lstrip("/")
                if server.auth is not None:
                    token = base64.b64encode(":".join(server.auth).encode()).decode()
                    if self.headers.get("Authorization") != f"Basic {token}":
                        server.refused.append(path)
                        self.send_response(401)
                        self.send_header("WWW-Authenticate", 'Basic realm="mirror"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                server.requests.append((path, self.headers.get("Range")))
                file = server.root / path
                if server.unavailable.get(path, 0) > 0:
                    server.unavailable[path] -= 1
                    self.send_error(503)
                    return
                if not file.is_file():
                    self.send_error(404)
                    return
                data = file.read_bytes()
                etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
                start = 0
                wanted = self.headers.get("Range")
                if_range = self.headers.get("If-Range")
                if wanted and not server.ignore_range and if_range in (None, etag):
                    start = int(re.fullmatch(r"bytes=(\d+)-", wanted).group(1))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("ETag", etag)
                self.end_headers()
                body = data[start:]
                drop = server.drop_after.pop(path, None)
                if drop is not None:
                    self.wfile.write(body[:drop])
                    self.wfile.flush()
                    self.close_connection = True
                    if path in server.replace_after_drop:
                        file.write_bytes(server.replace_after_drop.pop(path))
                    return
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]
