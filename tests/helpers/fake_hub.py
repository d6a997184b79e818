"""A local stand-in for the part of the Hugging Face hub `huggingface_hub` uses (point HF_ENDPOINT at `url`):
`/api/models` (search), `/api/models/{repo}[/revision/{rev}]` (model_info with LFS sha256), and
`/{repo}/resolve/{rev}/{file}` (HEAD and GET, answered like the hub: a 302 to an LFS "CDN" path carrying
X-Repo-Commit, X-Linked-Etag and X-Linked-Size; the CDN path serves the bytes with Range support).

Invariants: binds 127.0.0.1 on a free port; `with FakeHub() as hub:` stops it (and it stops itself after
`lifetime_s` if a test forgets); every request is recorded with the bytes its answer carried, so a test can assert
what a resumed download asked for. Faults are one-shot switches: `drop_after` (send the headers of the whole body,
then this many bytes, then close the socket) and `corrupt` (serve bytes whose sha256 is not the listed one);
`chunk_delay_s` slows the link down.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Served:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int = 0


@dataclass
class RepoFile:
    source: Path | bytes
    sha256: str
    size: int

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start:end]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(end - start)


class FakeHub:
    def __init__(self, lifetime_s: float = 600.0) -> None:
        self.repos: dict[str, dict[str, RepoFile]] = {}
        self.requests: list[Served] = []
        self.drop_after: int | None = None      # one-shot: the next content GET sends this many bytes then closes
        self.corrupt = False                     # while set: content GETs flip the first byte they send
        self.chunk_delay_s = 0.0                 # a pause after each 256 KiB sent: a slow link a test can kill
        self.ignore_range = False                # answer a Range GET with the whole body (200), as some proxies do
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args) -> None:
                pass

            def do_HEAD(self) -> None:   # noqa: N802 - http.server's naming
                hub._answer(self, head=True)

            def do_GET(self) -> None:    # noqa: N802
                hub._answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-hub")
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True
        self._stopped = False

    # set-up --------------------------------------------------------------------------------------------------
    def add_file(self, repo: str, name: str, source: Path | bytes) -> RepoFile:
        """Serves `source` (a file or bytes) as `repo`/`name`; its sha256 is the LFS oid listed."""
        if isinstance(source, bytes):
            sha, size = hashlib.sha256(source).hexdigest(), len(source)
        else:
            digest = hashlib.sha256()
            with open(source, "rb") as f:
                while chunk := f.read(8 << 20):
                    digest.update(chunk)
            sha, size = digest.hexdigest(), Path(source).stat().st_size
        entry = RepoFile(source, sha, size)
        self.repos.setdefault(repo, {})[name] = entry
        return entry

    def start(self) -> FakeHub:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    def content_requests(self) -> list[Served]:
        """The GETs that carried file bytes (the LFS path), in order."""
        return [r for r in self.requests if r.method == "GET" and r.path.startswith("/lfs/")]

    # answers -------------------------------------------------------------------------------------------------
    def _record(self, handler, status: int, body_bytes: int = 0) -> None:
        with self._lock:
            self.requests.append(Served(handler.command, handler.path, handler.headers.get("Range"), status,
                                        body_bytes))

    def _json(self, handler, status: int, payload, head: bool) -> None:
        body = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)
        self._record(handler, status, 0 if head else len(body))

    def _not_found(self, handler, head: bool, kind: str = "Repository") -> None:
        handler.send_response(404)
        body = json.dumps({"error": f"{kind} not found"}).encode()
        handler.send_header("X-Error-Code", "RepoNotFound" if kind == "Repository" else "EntryNotFound")
        handler.send_header("X-Error-Message", f"{kind} not found")
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)
        self._record(handler, 404)

    def _model_info(self, repo: str) -> dict:
        files = self.repos[repo]
        siblings = [{"rfilename": name, "size": f.size, "blobId": hashlib.sha1(f.sha256.encode()).hexdigest(),
                     "lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134}} for name, f in files.items()]
        siblings.append({"rfilename": "README.md", "size": 20, "blobId": "0" * 40})
        return {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "gated": False, "downloads": 42,
                "likes": 7, "tags": ["gguf"], "library_name": "gguf", "lastModified": "2025-01-02T03:04:05.000Z",
                "siblings": siblings}

    def _answer(self, handler, head: bool) -> None:
        parts = urlsplit(handler.path)
        path = unquote(parts.path)
        if path == "/api/models":
            query = parse_qs(parts.query)
            needle = (query.get("search") or [""])[0].lower()
            found = [{"id": repo, "modelId": repo, "downloads": 42, "likes": 7, "tags": ["gguf"],
                      "lastModified": "2025-01-02T03:04:05.000Z"} for repo in sorted(self.repos)
                     if needle in repo.lower()]
            return self._json(handler, 200, found, head)
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/"):]
            repo = rest.split("/revision/")[0]
            if repo not in self.repos:
                return self._not_found(handler, head)
            return self._json(handler, 200, self._model_info(repo), head)
        if path.startswith("/lfs/"):
            return self._content(handler, path[len("/lfs/"):], head)
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if resolve:
            repo, _revision, name = resolve.groups()
            entry = self.repos.get(repo, {}).get(name)
            if entry is None:
                return self._not_found(handler, head, "Repository" if repo not in self.repos else "Entry")
            handler.send_response(302)
            handler.send_header("Location", f"/lfs/{repo}/{name}")
            handler.send_header("X-Repo-Commit", COMMIT)
            handler.send_header("X-Linked-Etag", f'"{entry.sha256}"')
            handler.send_header("X-Linked-Size", str(entry.size))
            handler.send_header("ETag", f'"{entry.sha256}"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return self._record(handler, 302)
        return self._not_found(handler, head)

    def _content(self, handler, key: str, head: bool) -> None:
        repo, _, name = key.partition("/")
        repo_name, _, name = name.partition("/")
        entry = self.repos.get(f"{repo}/{repo_name}", {}).get(name)
        if entry is None:
            return self._not_found(handler, head, "Entry")
        start, end = 0, entry.size
        wanted = None if self.ignore_range else handler.headers.get("Range")
        status = 200
        if wanted:
            found = re.match(r"bytes=(\d+)-(\d*)$", wanted)
            start = int(found.group(1))
            end = int(found.group(2)) + 1 if found.group(2) else entry.size
            if start >= entry.size:
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{entry.size}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return self._record(handler, 416)
            status = 206
        handler.send_response(status)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(end - start))
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("ETag", f'"{entry.sha256}"')
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{entry.size}")
        handler.end_headers()
        if head:
            return self._record(handler, status)
        with self._lock:
            drop, self.drop_after = self.drop_after, None
        limit = end if drop is None else min(end, start + drop)
        sent, position = 0, start
        try:
            while position < limit:
                chunk = entry.read(position, min(limit, position + (256 << 10)))
                if self.corrupt and position == start:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                handler.wfile.write(chunk)
                position += len(chunk)
                sent += len(chunk)
                if self.chunk_delay_s:
                    time.sleep(self.chunk_delay_s)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self._record(handler, status, sent)
        if drop is not None:
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(2)      # the peer sees the body end early
