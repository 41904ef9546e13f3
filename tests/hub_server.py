"""A local stand-in for the Hugging Face hub's file endpoints, for the download tests.

It answers what `huggingface_hub.hf_hub_download` asks, the way the hub does: a HEAD on
`/{repo}/resolve/{revision}/{file}` first, then a GET where that points.

* A small file: 307 to `/api/resolve-cache/models/{repo}/{commit}/{file}` on the same host, which
  answers 200 with `ETag` (the git blob sha1), `X-Repo-Commit` and `Content-Length`.
* A large (LFS) file: 302 to another origin (the CDN: a second port, named `localhost`) with
  `X-Linked-Etag` (the sha256), `X-Linked-Size` and `X-Repo-Commit`; the CDN serves the bytes,
  ranges included (`Range: bytes=N-` -> 206 with `Content-Range`).
* A missing repo: 401 `X-Error-Code: RepoNotFound`; a missing revision or file: 404
  `RevisionNotFound` / `EntryNotFound`.

`Faults` makes it misbehave (a fixed status, a stall, a transfer cut once); every request is
recorded in `requests` as (server, method, path, Range header). `LocalProxy` stands for a proxy
that alone reaches the hub.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

LFS_SUFFIXES = (".safetensors",)
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)$")
_CACHE = re.compile(r"^/api/resolve-cache/models/(?P<repo>[^/]+/[^/]+)/(?P<commit>[0-9a-f]{40})/"
                    r"(?P<file>.+)$")
_BLOB = re.compile(r"^/blobs/(?P<sha>[0-9a-f]{64})$")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Faults:
    """How the hub misbehaves; changed by a test while the server runs."""

    status: int | None = None   # every resolve request answered with this status
    stall: str | None = None    # "metadata": HEAD never answered; "transfer": half the bytes, then
    #                             silence
    cut_once: bool = False      # the first transfer of a large file closes the connection halfway
    altered: bool = False       # large files arrive with their last byte changed (same length,
    #                             same advertised sha256: what a corrupting proxy delivers)


@dataclass
class LocalHub:
    """The hub (`endpoint`) and its CDN, serving `files` of `repo` at `commit` (and at main)."""

    repo: str
    commit: str
    files: dict[str, bytes]
    faults: Faults = field(default_factory=Faults)
    requests: list[tuple[str, str, str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.released = threading.Event()   # set at close: every stalled answer gives up
        self.hub = _server(self, "hub")
        self.cdn = _server(self, "cdn")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_port}"

    @property
    def cdn_url(self) -> str:
        # Another host name for the same loopback server, as the real CDN is another host:
        # huggingface_hub 1.x follows a metadata request's redirect when the host name is the
        # hub's (whatever the port) and then misses the hub's headers on the CDN's answer.
        return f"http://localhost:{self.cdn.server_port}"

    def by_sha256(self, sha: str) -> bytes | None:
        return next((data for data in self.files.values()
                     if hashlib.sha256(data).hexdigest() == sha), None)

    def close(self) -> None:
        self.released.set()
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> LocalHub:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def _server(hub: LocalHub, role: str) -> ThreadingHTTPServer:
    handler = type(f"{role.title()}Handler", (_Handler,), {"hub": hub, "role": role})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: LocalHub
    role: str

    def log_message(self, *_args) -> None:   # quiet: pytest shows failures, not traffic
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        hub = self.hub
        hub.requests.append((self.role, self.command, self.path, self.headers.get("Range")))
        if self.role == "cdn":
            self._blob(body=body)
            return
        if hub.faults.stall == "metadata":
            hub.released.wait(60)
            return
        if hub.faults.status is not None:
            self._error(hub.faults.status)
            return
        if match := _RESOLVE.match(self.path):
            self._resolve(match["repo"], match["revision"], match["file"])
        elif match := _CACHE.match(self.path):
            self._cached(match["repo"], match["commit"], match["file"], body=body)
        else:
            self._error(404, "EntryNotFound")

    def _error(self, status: int, code: str | None = None) -> None:
        codes = {401: "RepoNotFound", 404: "EntryNotFound"}
        message = b"error"
        self.send_response(status)
        if code or status in codes:
            self.send_header("X-Error-Code", code or codes[status])
            self.send_header("X-Error-Message", "Repository not found" if status == 401
                             else "Entry not found")
        self.send_header("X-Repo-Commit", self.hub.commit)
        self.send_header("Content-Length", str(len(message)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(message)

    def _resolve(self, repo: str, revision: str, name: str) -> None:
        hub = self.hub
        if repo != hub.repo:
            return self._error(401, "RepoNotFound")
        if revision not in (hub.commit, "main"):
            return self._error(404, "RevisionNotFound")
        data = hub.files.get(name)
        if data is None:
            return self._error(404, "EntryNotFound")
        self.send_response(302 if name.endswith(LFS_SUFFIXES) else 307)
        self.send_header("X-Repo-Commit", hub.commit)
        if name.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            self.send_header("Location", f"{hub.cdn_url}/blobs/{sha}")
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{git_blob_sha1(b"version lfs pointer " + sha.encode())}"')
        else:
            self.send_header("Location", f"/api/resolve-cache/models/{repo}/{hub.commit}/{name}")
        self.send_header("Content-Length", "0")
        self.end_headers()
        return None

    def _cached(self, repo: str, commit: str, name: str, *, body: bool) -> None:
        data = self.hub.files.get(name) if (repo, commit) == (self.hub.repo, self.hub.commit) \
            else None
        if data is None:
            return self._error(404, "EntryNotFound")
        self.send_response(200)
        self.send_header("ETag", f'"{git_blob_sha1(data)}"')
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
        return None

    def _blob(self, *, body: bool) -> None:
        match = _BLOB.match(self.path)
        data = self.hub.by_sha256(match["sha"]) if match else None
        if data is None:
            return self._error(404)
        if self.hub.faults.altered:
            data = data[:-1] + bytes([data[-1] ^ 1])
        start = 0
        wanted = self.headers.get("Range")
        if wanted and (ranged := re.fullmatch(r"bytes=(\d+)-", wanted)):
            start = int(ranged[1])
        self.send_response(206 if start else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return None
        faults = self.hub.faults
        half = start + (len(data) - start) // 2
        if faults.stall == "transfer":
            self.wfile.write(data[start:half])
            self.wfile.flush()
            self.hub.released.wait(60)
            self.close_connection = True
            return None
        if faults.cut_once and not start:
            faults.cut_once = False
            self.wfile.write(data[:half])
            self.wfile.flush()
            self.close_connection = True   # the peer sees the body end early
            return None
        self.wfile.write(data[start:])
        return None


@dataclass
class LocalProxy:
    """A stand-in HTTP proxy, as a company network has: it forwards plain-HTTP requests
    (absolute URLs), those for a host in `routes` to where only the proxy reaches it, and
    answers an HTTPS tunnel (CONNECT) with 502; every request is recorded in `requests` as
    (method, target)."""

    routes: dict[str, str] = field(default_factory=dict)   # "host:port" asked -> reached
    requests: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        handler = type("ProxyHandler", (_ProxyHandler,), {"proxy": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> LocalProxy:
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()


#: Headers of one connection, never forwarded.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
               "proxy-authorization", "upgrade"}


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: LocalProxy

    def log_message(self, *_args) -> None:
        pass

    def do_CONNECT(self) -> None:
        self.proxy.requests.append(("CONNECT", self.path))
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.close_connection = True

    def do_HEAD(self) -> None:
        self._forward()

    def do_GET(self) -> None:
        self._forward()

    def _forward(self) -> None:
        self.proxy.requests.append((self.command, self.path))
        target = urlsplit(self.path)
        connection = http.client.HTTPConnection(
            self.proxy.routes.get(target.netloc, target.netloc), timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        connection.request(self.command, target.path + (f"?{target.query}" if target.query
                                                        else ""), headers=headers)
        answer = connection.getresponse()
        body = answer.read()
        connection.close()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in _HOP_BY_HOP and (self.command == "HEAD"
                                                   or key.lower() != "content-length"):
                self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
