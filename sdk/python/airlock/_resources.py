"""The per-sandbox resource handles: ``sb.files``, ``sb.network``, ``sb.ports``."""

from __future__ import annotations

import io
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, TypeVar, Union

from ._transport import Response, Transport, quote_segment
from .errors import AirlockError, NotFound, error_from_body
from .types import FileEntry, WatchEvent

_CHUNK = 256 * 1024
_S = TypeVar("_S", bound="_Stream")
Data = Union[bytes, bytearray, str, IO[bytes]]


def read_chunks(f: IO[bytes], size: int = _CHUNK) -> Iterator[bytes]:
    """Yields ``f``'s content ``size`` bytes at a time: an upload body of bounded memory."""
    while True:
        chunk = f.read(size)
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode()
        yield chunk


class _Stream:
    """An NDJSON stream that is iterable and closable (also as a context manager)."""

    def __init__(self, resp: Response) -> None:
        self._resp = resp
        self._lines = resp.lines()

    def _next_json(self) -> Dict[str, Any]:
        return next(self._lines)

    def close(self) -> None:
        """Ends the stream (the daemon sees the hang-up and stops sending)."""
        self._lines.close()
        self._resp.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Watch(_Stream):
    """Iterates :class:`WatchEvent` as the guest reports them, until closed.

    The watch is in place once :meth:`Files.watch` returns: changes made after
    that are reported.
    """

    def __init__(self, resp: Response) -> None:
        super().__init__(resp)
        try:
            first = self._next_json()
        except StopIteration:
            first = {}
        if first.get("type") != "watching":
            self.close()
            raise error_from_body(resp.status, first)
        self.path: str = str(first.get("path", ""))
        #: The daemon's closing line ``{"type": "end", "reason", ...}`` once
        #: the stream ended from its side, else ``None``.
        self.end: Optional[Dict[str, Any]] = None

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> WatchEvent:
        j = self._next_json()
        if "error" in j:
            self.close()
            raise error_from_body(None, j)
        if j.get("type") == "end":
            # The watch ended in the guest (or the sandbox stopped): the
            # daemon says why; the iteration ends.
            self.end = j
            self.close()
            raise StopIteration
        return WatchEvent.from_json(j)


class NetworkEvents(_Stream):
    """Iterates network events (dicts) as the sandbox records them, until it ends."""

    def __iter__(self) -> "NetworkEvents":
        return self

    def __next__(self) -> Dict[str, Any]:
        j = self._next_json()
        if "error" in j and len(j) == 1:
            self.close()
            raise error_from_body(None, j)
        return j


class _Handle:
    """Sends a sandbox's requests; errors go through the sandbox's ``explain``
    (an error caused by the sandbox having failed becomes SandboxFailed)."""

    def __init__(self, transport: Transport, sandbox_id: str,
                 explain: Callable[[AirlockError], AirlockError]) -> None:
        self._transport = transport
        self._explain = explain
        self._sb = "/v1/sandboxes/" + quote_segment(sandbox_id)

    def _request(self, method: str, path: str, **kw: Any) -> Response:
        try:
            return self._transport.request(method, path, **kw)
        except AirlockError as e:
            raise self._explain(e) from None

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self._request(method, path, **kw).json()


class Files(_Handle):
    """The sandbox's filesystem. Paths are absolute paths in the guest."""

    def __init__(self, transport: Transport, sandbox_id: str,
                 explain: Callable[[AirlockError], AirlockError]) -> None:
        super().__init__(transport, sandbox_id, explain)
        self._base = self._sb + "/files"

    def write(self, path: str, data: Data, mode: int = 0o644) -> int:
        """Writes ``data`` (bytes, str as UTF-8, or a binary file streamed in
        pieces) to ``path``, replacing it; returns the bytes written."""
        body: Any
        if isinstance(data, str):
            body = data.encode()
        elif isinstance(data, (bytes, bytearray)):
            body = bytes(data)
        else:
            body = read_chunks(data)
        r = self._call("PUT", self._base, query={"path": path, "mode": format(mode, "o")},
                         body=body)
        return int(r.get("bytes", 0))

    def read(self, path: str) -> bytes:
        """The content of ``path``."""
        buf = io.BytesIO()
        self.download(path, buf)
        return buf.getvalue()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The content of ``path`` decoded as text."""
        return self.read(path).decode(encoding)

    def download(self, path: str, out: IO[bytes]) -> int:
        """Streams ``path`` into the binary file ``out``; returns the bytes copied."""
        r = self._request("GET", self._base, query={"path": path}, timeout=None)
        n = 0
        while True:
            chunk = r.read_chunk(_CHUNK)
            if not chunk:
                return n
            out.write(chunk)
            n += len(chunk)

    def list(self, path: str) -> List[FileEntry]:
        """The entries of directory ``path``."""
        r = self._call("GET", self._base + "/list", query={"path": path})
        return [FileEntry.from_json(e) for e in r.get("entries", [])]

    def stat(self, path: str) -> FileEntry:
        """Type, size, mode and mtime of ``path``."""
        return FileEntry.from_json(self._call("GET", self._base + "/stat", query={"path": path}))

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def mkdir(self, path: str, parents: bool = False) -> None:
        """Creates directory ``path`` (and missing parents with ``parents=True``)."""
        self._call("POST", self._base + "/mkdir", json_body={"path": path, "parents": parents})

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes ``path`` (a directory's content too with ``recursive=True``)."""
        self._call("DELETE", self._base, query={"path": path, "recursive": recursive})

    def watch(self, path: str, recursive: bool = True) -> Watch:
        """Watches ``path`` for created / modified / deleted / renamed entries.

        Returns an iterator of :class:`WatchEvent` that runs until closed (use
        it as a context manager) or the sandbox ends.
        """
        r = self._request("GET", self._base + "/watch",
                            query={"path": path, "recursive": recursive}, timeout=None)
        return Watch(r)


class Network(_Handle):
    """The sandbox's egress policy and its record of network events."""

    def get(self) -> Dict[str, Any]:
        """The policy in force: ``{"mode", "allow"?, "deny"?}``."""
        return dict(self._call("GET", self._sb).get("network", {}))

    def set(self, mode: Optional[str] = None, allow: Optional[List[str]] = None,
            deny: Optional[List[str]] = None) -> Dict[str, Any]:
        """Replaces the policy. ``mode`` is ``none``, ``allowlist`` or ``open``;
        it defaults to ``allowlist`` when ``allow`` or ``deny`` is given.
        Returns the daemon's answer (the policy now in force)."""
        if mode is None:
            mode = "allowlist" if allow is not None or deny is not None else "none"
        policy: Dict[str, Any] = {"mode": mode}
        if allow is not None:
            policy["allow"] = list(allow)
        if deny is not None:
            policy["deny"] = list(deny)
        return dict(self._call("PATCH", self._sb + "/network",
                                 json_body=policy))

    def events(self, follow: bool = False) -> Any:
        """The network events recorded so far (a list of dicts), or with
        ``follow=True`` an iterator that also yields new ones until the sandbox ends."""
        path = self._sb + "/network/events"
        if not follow:
            return list(self._call("GET", path))
        return NetworkEvents(self._request("GET", path, query={"follow": True}, timeout=None))


class Ports(_Handle):
    """Host ports forwarded to ports in the guest."""

    def __init__(self, transport: Transport, sandbox_id: str,
                 explain: Callable[[AirlockError], AirlockError]) -> None:
        super().__init__(transport, sandbox_id, explain)
        self._base = self._sb + "/ports"

    def add(self, guest_port: int, host_port: int = 0) -> Dict[str, Any]:
        """Forwards ``host_port`` (0: the daemon picks one) to ``guest_port``;
        returns the mapping, with the host port chosen."""
        body = {"guest_port": guest_port}
        if host_port:
            body["host_port"] = host_port
        return dict(self._call("POST", self._base, json_body=body))

    def list(self) -> List[Dict[str, Any]]:
        """The forwards in place."""
        r = self._call("GET", self._base)
        return list(r.get("ports", r) if isinstance(r, dict) else r)

    def remove(self, host_port: int) -> None:
        """Removes the forward from ``host_port``."""
        self._call("DELETE", f"{self._base}/{int(host_port)}")
