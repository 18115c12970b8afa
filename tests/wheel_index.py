"""A package index on 127.0.0.1 that stands in for PyTorch's wheel index and its mirrors.

It serves real wheel files under the path layouts the real hosts use: PEP 503 pages
(`<prefix>/<project>/`, as download.pytorch.org/whl/<tag> and NJU's mirror do) and flat pages of
wheel links (`<prefix>/`, as Aliyun's pytorch-wheels/<tag> does), each link with its sha256 and
its PEP 658 metadata, so `pip install --dry-run` resolves without fetching the wheel itself.
Every other path is a 404, as on a host that does not carry the project. Requests are recorded.
"""

from __future__ import annotations

import hashlib
import html
import re
import threading
import urllib.parse
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def project_of(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def metadata_of(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name)


class WheelIndex:
    def __init__(self, wheels: list[Path], index_prefixes: list[str], flat_prefixes: list[str]) -> None:
        self.wheels = {wheel.name: wheel for wheel in wheels}
        self.metadata = {name: metadata_of(path) for name, path in self.wheels.items()}
        self.sha256 = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in self.wheels.items()}
        self.index_prefixes = [p.strip("/") for p in index_prefixes]
        self.flat_prefixes = [p.strip("/") for p in flat_prefixes]
        self.requests: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                index.requests.append(self.path)
                found = index.respond(urllib.parse.unquote(self.path.split("?")[0]))
                if found is None:
                    self.send_error(404)
                    return
                kind, body = found
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def links(self, names: list[str]) -> bytes:
        rows = []
        for name in names:
            meta = hashlib.sha256(self.metadata[name]).hexdigest()
            rows.append(
                f'<a href="/files/{html.escape(name)}#sha256={self.sha256[name]}" '
                f'data-dist-info-metadata="sha256={meta}" data-core-metadata="sha256={meta}">'
                f"{html.escape(name)}</a><br>"
            )
        return ("<!DOCTYPE html><html><body>\n" + "\n".join(rows) + "\n</body></html>\n").encode()

    def respond(self, path: str) -> tuple[str, bytes] | None:
        if path.startswith("/files/"):
            name = path[len("/files/") :]
            if name.endswith(".metadata") and name[: -len(".metadata")] in self.wheels:
                return "text/plain", self.metadata[name[: -len(".metadata")]]
            if name in self.wheels:
                return "application/octet-stream", self.wheels[name].read_bytes()
            return None
        trimmed = path.strip("/")
        if trimmed in self.flat_prefixes:
            return "text/html", self.links(sorted(self.wheels))
        prefix, _, project = trimmed.rpartition("/")
        if prefix in self.index_prefixes:
            names = sorted(name for name, wheel in self.wheels.items() if project_of(wheel) == project)
            if names:
                return "text/html", self.links(names)
        return None
