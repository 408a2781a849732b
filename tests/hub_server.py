"""A local stand-in for the model hub, for tests: real HTTP on 127.0.0.1, real files.

It answers the routes Hearthside uses the way huggingface.co does:
- `GET /api/models?search=...&filter=gguf&limit=N` — search results as JSON;
- `GET /api/models/{owner}/{name}/revision/{rev}?blobs=true` — the repo's files with sizes
  and `lfs.sha256`, and the commit `sha`;
- `GET /{owner}/{name}/resolve/{rev}/{path}` — a 302 to a second "CDN" path, with the
  `X-Linked-Size` and `X-Linked-Etag` headers the hub sends;
- `GET /cdn/{owner}/{name}/{path}` — the bytes, honouring `Range: bytes=N-` (206 +
  Content-Range).

Switches on `HubState` make it misbehave: drop the connection after N body bytes, flip a byte,
ignore Range (answer 200), or redirect somewhere else; `hold_after_bytes` makes the next file
response stall after N bytes until `released` is set (a slow hub, for cancelling mid-download).
A repo marked `gated` answers 401 on its files unless the request carries `token`. Every request
is logged.

`write_llama_gguf` writes a small but complete llama-style GGUF (optionally split into parts)
that llama.cpp loads and generates from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import gguf
import numpy as np

COMMIT_SHA = "0123456789abcdef0123456789abcdef01234567"
_SEND_BLOCK_BYTES = 256 * 1024
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_HOLD_LIMIT_S = 30.0  # a stalled response gives up waiting for `released` after this long


@dataclass(frozen=True)
class ServedFile:
    path: Path
    size_bytes: int
    sha256: str
    list_sha256: bool = True  # whether the listing carries lfs.sha256

    @classmethod
    def of(cls, path: Path, *, list_sha256: bool = True) -> ServedFile:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return cls(path, path.stat().st_size, digest, list_sha256)


@dataclass(frozen=True)
class RequestRecord:
    path: str
    query: dict[str, list[str]]
    range: str | None
    authorization: str | None
    status: int
    body_bytes: int


@dataclass
class HubRepo:
    files: dict[str, ServedFile] = field(default_factory=dict)
    extra_siblings: list[dict[str, Any]] = field(default_factory=list)  # raw listing entries
    downloads: int = 0
    likes: int = 0
    gated: bool = False  # its files answer 401 without `Authorization: Bearer <HubState.token>`


@dataclass
class HubState:
    repos: dict[str, HubRepo] = field(default_factory=dict)
    cut_after_bytes: int | None = None  # the next file response stops after this many bytes
    corrupt_offset: int | None = None  # every file response flips the byte at this offset
    ignore_range: bool = False
    redirect_location: str | None = None  # resolve answers 302 here instead of /cdn/...
    hold_after_bytes: int | None = None  # the next file response stalls after this many bytes
    holding: threading.Event = field(default_factory=threading.Event)  # set while it stalls
    released: threading.Event = field(default_factory=threading.Event)  # ends the stall
    token: str | None = None  # the access token gated repos accept
    lock: threading.Lock = field(default_factory=threading.Lock)
    _log: list[tuple[int, RequestRecord]] = field(default_factory=list)  # by arrival
    _arrived: int = 0
    _in_flight: int = 0
    _settled: threading.Condition = field(default_factory=threading.Condition)

    def add_file(self, repo: str, filename: str, path: Path, **kwargs: Any) -> ServedFile:
        served = ServedFile.of(path, **kwargs)
        self.repos.setdefault(repo, HubRepo()).files[filename] = served
        return served

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request so far in the order they arrived, once the server has finished
        logging them (a client can read a whole response, and send its next request, before
        the handler that sent it has logged it)."""
        with self._settled:
            self._settled.wait_for(lambda: self._in_flight == 0, timeout=10)
            return [record for _arrival, record in sorted(self._log, key=lambda e: e[0])]

    def file_requests(self) -> list[RequestRecord]:
        return [record for record in self.requests if record.path.startswith("/cdn/")]

    def started(self) -> int:
        """The request's place in the order of arrival."""
        with self._settled:
            self._in_flight += 1
            self._arrived += 1
            return self._arrived

    def finished(self, arrival: int, record: RequestRecord) -> None:
        with self._settled:
            self._log.append((arrival, record))
            self._in_flight -= 1
            self._settled.notify_all()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    _hold_after: int | None = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        return

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        state = self.server.state
        arrival = state.started()
        status, sent = 500, 0
        try:
            status, sent = self._route(path, query)
        finally:
            state.finished(
                arrival,
                RequestRecord(
                    path=path,
                    query=query,
                    range=self.headers.get("Range"),
                    authorization=self.headers.get("Authorization"),
                    status=status,
                    body_bytes=sent,
                ),
            )

    # -- routes --

    def _route(self, path: str, query: dict[str, list[str]]) -> tuple[int, int]:
        state = self.server.state
        if path == "/api/models":
            return self._json(200, self._search(query))
        listing = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if listing:
            repo = state.repos.get(listing.group(1))
            if repo is None:
                return self._json(404, {"error": "Repository not found"})
            return self._json(200, self._listing(listing.group(1), repo))
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if resolve:
            return self._redirect(resolve.group(1), resolve.group(3))
        cdn = re.fullmatch(r"/cdn/([^/]+/[^/]+)/(.+)", path)
        if cdn:
            served = state.repos.get(cdn.group(1), HubRepo()).files.get(cdn.group(2))
            if served is not None:
                return self._send_file(served)
        return self._json(404, {"error": "Entry not found"})

    def _search(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        words = query.get("search", [""])[0].lower()
        limit = int(query.get("limit", ["1000"])[0])
        found = [
            {
                "_id": f"id-{index}",
                "id": repo_id,
                "downloads": repo.downloads,
                "likes": repo.likes,
                "lastModified": "2025-08-14T12:00:00.000Z",
                "gated": "manual" if repo.gated else False,
                "tags": ["gguf"],
            }
            for index, (repo_id, repo) in enumerate(self.server.state.repos.items())
            if words in repo_id.lower()
        ]
        found.sort(key=lambda item: -int(item["downloads"]))
        return found[:limit]

    def _listing(self, repo_id: str, repo: HubRepo) -> dict[str, Any]:
        siblings: list[dict[str, Any]] = [{"rfilename": "README.md", "size": 12}]
        for filename, served in repo.files.items():
            lfs: dict[str, Any] = {"size": served.size_bytes, "pointerSize": 135}
            if served.list_sha256:
                lfs["sha256"] = served.sha256
            siblings.append({"rfilename": filename, "size": served.size_bytes, "lfs": lfs})
        siblings.extend(repo.extra_siblings)
        return {"id": repo_id, "sha": COMMIT_SHA, "siblings": siblings}

    def _redirect(self, repo_id: str, filename: str) -> tuple[int, int]:
        state = self.server.state
        repo = state.repos.get(repo_id, HubRepo())
        served = repo.files.get(filename)
        if served is None:
            return self._json(404, {"error": "Entry not found"})
        if repo.gated and not self._authorized():
            return self._json(401, {"error": f"Access to model {repo_id} is restricted."})
        location = state.redirect_location or f"/cdn/{repo_id}/{urllib.parse.quote(filename)}"
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("X-Linked-Size", str(served.size_bytes))
        self.send_header("X-Linked-Etag", f'"{served.sha256}"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return 302, 0

    def _authorized(self) -> bool:
        token = self.server.state.token
        return token is not None and self.headers.get("Authorization") == f"Bearer {token}"

    def _send_file(self, served: ServedFile) -> tuple[int, int]:
        state = self.server.state
        start = self._range_start(served.size_bytes)
        with state.lock:
            cut_after, state.cut_after_bytes = state.cut_after_bytes, None
            self._hold_after, state.hold_after_bytes = state.hold_after_bytes, None
        status = 200 if start == 0 and self.headers.get("Range") is None else 206
        if state.ignore_range:
            start, status = 0, 200
        if start >= served.size_bytes and status == 206:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{served.size_bytes}")
            self.end_headers()
            return 416, 0
        self.send_response(status)
        self.send_header("Content-Length", str(served.size_bytes - start))
        if status == 206:
            last = served.size_bytes - 1
            self.send_header("Content-Range", f"bytes {start}-{last}/{served.size_bytes}")
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return status, self._send_body(served.path, start, cut_after)

    def _range_start(self, size: int) -> int:
        match = _RANGE.fullmatch(self.headers.get("Range") or "")
        return min(int(match.group(1)), size) if match else 0

    def _send_body(self, path: Path, start: int, cut_after: int | None) -> int:
        corrupt = self.server.state.corrupt_offset
        sent = 0
        with path.open("rb") as source:
            source.seek(start)
            while block := source.read(self._next_block_bytes(sent)):
                self._stall_if_held(sent)
                if cut_after is not None:
                    block = block[: max(0, cut_after - sent)]
                if corrupt is not None and start + sent <= corrupt < start + sent + len(block):
                    index = corrupt - start - sent
                    block = block[:index] + bytes([block[index] ^ 0xFF]) + block[index + 1 :]
                if not block:
                    break
                try:
                    self.wfile.write(block)
                except OSError:
                    break  # the client went away
                sent += len(block)
        if cut_after is not None:
            self._drop_connection()
        return sent

    def _next_block_bytes(self, sent: int) -> int:
        """Blocks end exactly at the hold point, so the client has all bytes before it."""
        hold = self._hold_after
        if hold is not None and sent < hold:
            return min(_SEND_BLOCK_BYTES, hold - sent)
        return _SEND_BLOCK_BYTES

    def _stall_if_held(self, sent: int) -> None:
        if self._hold_after is None or sent < self._hold_after:
            return
        self._hold_after = None
        self.wfile.flush()
        state = self.server.state
        state.holding.set()
        state.released.wait(timeout=_HOLD_LIMIT_S)
        state.holding.clear()

    def _drop_connection(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may have gone already
            self.connection.shutdown(socket.SHUT_RDWR)

    def _json(self, status: int, payload: Any) -> tuple[int, int]:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return status, len(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state


class HubServer:
    """`with HubServer() as hub:` serves `hub.state` at `hub.url` until the block ends."""

    def __init__(self, state: HubState | None = None) -> None:
        self.state = state or HubState()
        self._server = _Server(self.state)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="test-hub-server",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.state.released.set()  # no handler thread stays stalled past the server
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


# --- a small complete model ------------------------------------------------------------------

_BYTE_TOKEN_TYPE = 6
_NORMAL_TOKEN_TYPE = 1
_CONTROL_TOKEN_TYPE = 3
_UNKNOWN_TOKEN_TYPE = 2


def write_llama_gguf(
    path: Path,
    *,
    hidden: int = 256,
    feed_forward: int = 1024,
    layers: int = 1,
    split_max_tensors: int = 0,
    seed: int = 0,
) -> list[Path]:
    """A llama-style F32 GGUF with random weights and an SPM byte vocabulary.

    With `split_max_tensors` it is written as llama.cpp split parts next to `path`
    (`<stem>-00001-of-0000N.gguf` ...). Returns the files written, first part first. The
    defaults make one file of about 4.3 MB. (Keep `hidden` at 128 or more: at 64, with four
    heads of 16 dims, this llama.cpp build loads the model but fails to decode.)
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name(f"Hub Test Llama {seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_hparams(writer, hidden, feed_forward, layers)
    _add_vocab(writer)
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    tensor("token_embd.weight", _VOCAB_SIZE, hidden)
    tensor("output_norm.weight", hidden)
    for layer in range(layers):
        tensor(f"blk.{layer}.attn_norm.weight", hidden)
        for name in ("q", "k", "v", "output"):
            tensor(f"blk.{layer}.attn_{name}.weight", hidden, hidden)
        tensor(f"blk.{layer}.ffn_norm.weight", hidden)
        tensor(f"blk.{layer}.ffn_gate.weight", feed_forward, hidden)
        tensor(f"blk.{layer}.ffn_up.weight", feed_forward, hidden)
        tensor(f"blk.{layer}.ffn_down.weight", hidden, feed_forward)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors == 0:
        return [path]
    return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))


_TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), "▁hi"]
_VOCAB_SIZE = len(_TOKENS)


def _add_hparams(writer: gguf.GGUFWriter, hidden: int, feed_forward: int, layers: int) -> None:
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(feed_forward)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-5)


def _add_vocab(writer: gguf.GGUFWriter) -> None:
    types = [_UNKNOWN_TOKEN_TYPE, _CONTROL_TOKEN_TYPE, _CONTROL_TOKEN_TYPE]
    types += [_BYTE_TOKEN_TYPE] * 256 + [_NORMAL_TOKEN_TYPE]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(_TOKENS)
    writer.add_token_scores([0.0] * len(_TOKENS))
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
