"""A local stand-in for the Hugging Face Hub API, for push tests: an HTTP server on 127.0.0.1 (port 0) in a
background thread that speaks just what `HfApi(endpoint=..., token=...)`'s create_repo, create_branch and
upload_folder send (repos/create, branch, validate-yaml, preupload with every file "regular", the ndjson commit, and
the revision info asked for when nothing changed). It keeps what it was sent, so tests can read the commits' files.

Failures are scripted: `fail_next` holds what the next requests get instead of an answer (an HTTP status such as 503
or 429, "reset": the connection is closed with SO_LINGER 0, a TCP reset, without a byte of answer, or None: the
normal answer); `always` does that to every request after them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

TOKEN = "hf_fake"
RESET = "reset"
_REPO_PATH = re.compile(
    r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<what>preupload|commit|branch|revision)/(?P<rev>[^/?]+))?/?(?:\?.*)?$"
)


def git_blob_oid(content: bytes) -> str:
    """The git object id of a blob: what the Hub reports as a regular file's oid."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Commit:
    repo_id: str
    revision: str
    message: str
    oid: str
    files: dict[str, bytes]


@dataclass
class Repo:
    private: bool | None
    files: dict[str, bytes] = field(default_factory=dict)
    branches: set[str] = field(default_factory=lambda: {"main"})
    head: str = "0" * 40


class FakeHub:
    """`with FakeHub() as hub: HfApi(endpoint=hub.url, token=fake_hub.TOKEN)...`"""

    def __init__(self, fail_next=(), always: int | str | None = None):
        self.fail_next = deque(fail_next)
        self.always = always
        self.requests: list[tuple[str, str, str]] = []  # (method, path, what happened: "ok", "503", "reset", ...)
        self.repos: dict[str, Repo] = {}
        self.commits: list[Commit] = []
        self.unexpected: list[str] = []  # requests for anything this stand-in does not know (a test should fail)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def answered(self, outcome: str = "ok") -> list[tuple[str, str]]:
        """(method, path) of the requests that got `outcome`."""
        return [(method, path) for method, path, got in self.requests if got == outcome]

    def failure_for_next_request(self) -> int | str | None:
        with self._lock:
            return self.fail_next.popleft() if self.fail_next else self.always

    # ------------------------------------------------------------------ the API, called with the lock held

    def create_repo(self, body: dict) -> tuple[int, dict]:
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        url = f"{self.url}/{repo_id}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": url}
        self.repos[repo_id] = Repo(private=body.get("visibility") == "private" if "visibility" in body else None)
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def preupload(self, repo: Repo, body: dict) -> tuple[int, dict]:
        files = []
        for entry in body["files"]:
            old = repo.files.get(entry["path"])
            files.append({"path": entry["path"], "uploadMode": "regular", "shouldIgnore": False,
                          "oid": git_blob_oid(old) if old is not None else None})
        return 200, {"files": files}

    def commit(self, repo_id: str, repo: Repo, revision: str, raw: bytes) -> tuple[int, dict]:
        lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        files = {}
        for line in lines:
            if line["key"] == "file":
                assert line["value"]["encoding"] == "base64", line
                files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
            elif line["key"] != "header":
                self.unexpected.append(f"commit operation {line['key']}")
        oid = hashlib.sha1(f"{repo_id}@{len(self.commits)}".encode()).hexdigest()
        repo.files.update(files)
        repo.head = oid
        self.commits.append(Commit(repo_id, revision, header["summary"], oid, files))
        return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "success": True}


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            failure = hub.failure_for_next_request()
            if failure == RESET:
                hub.requests.append((self.command, self.path, RESET))
                self._reset()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if failure is not None:
                hub.requests.append((self.command, self.path, str(failure)))
                self._answer(int(failure), {"error": f"scripted failure {failure}"})
                return
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                hub.requests.append((self.command, self.path, "401"))
                self._answer(401, {"error": "Invalid credentials in Authorization header"})
                return
            with hub._lock:
                status, payload, headers = self._route(body)
            hub.requests.append((self.command, self.path, "ok" if status < 400 else str(status)))
            self._answer(status, payload, headers)

        def _route(self, body: bytes) -> tuple[int, dict, dict]:
            if self.command == "POST" and self.path == "/api/repos/create":
                return (*hub.create_repo(json.loads(body)), {})
            if self.command == "POST" and self.path == "/api/validate-yaml":  # upload_folder checks README.md's
                return 200, {"errors": [], "warnings": []}, {}
            match = _REPO_PATH.match(self.path)
            if match is None:
                hub.unexpected.append(f"{self.command} {self.path}")
                return 404, {"error": "not known to the fake Hub"}, {}
            repo_id, what, revision = match["repo"], match["what"] or "revision", match["rev"] or "main"
            repo = hub.repos.get(repo_id)
            if repo is None:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            if what == "branch" and self.command == "POST":
                if revision in repo.branches:
                    return 409, {"error": "Reference already exists"}, {}
                repo.branches.add(revision)
                return 200, {}, {}
            if revision not in repo.branches:
                return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
            if what == "preupload" and self.command == "POST":
                return (*hub.preupload(repo, json.loads(body)), {})
            if what == "commit" and self.command == "POST":
                return (*hub.commit(repo_id, repo, revision, body), {})
            if what == "revision" and self.command == "GET":
                siblings = [{"rfilename": name} for name in sorted(repo.files)]
                return 200, {"id": repo_id, "modelId": repo_id, "sha": repo.head, "siblings": siblings}, {}
            hub.unexpected.append(f"{self.command} {self.path}")
            return 404, {"error": "not known to the fake Hub"}, {}

        def _answer(self, status: int, payload: dict, headers: dict | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _reset(self) -> None:
            """Close the connection with a TCP reset and no answer (the request body is left unread)."""
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()  # the socket's last file: closing it too really closes the socket
            self.connection.close()

    return Handler
