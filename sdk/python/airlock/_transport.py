"""HTTP/1.1 to the daemon over its unix socket (or TCP), standard library only.

Connections are kept alive and reused from a small pool, so a client is safe
to share between threads and a call costs no connect(). Streaming responses
(exec output, watch events) hold their connection until fully read; a stream
abandoned early closes its connection, which the daemon sees as a hang-up
(it kills an exec whose client is gone).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import pwd
import socket
import ssl
import threading
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from .errors import (AirlockError, DaemonUnavailable, InvalidArgument, Timeout,
                     error_from_body)

#: Seconds a plain (non-streaming) call may take before :class:`Timeout`.
DEFAULT_TIMEOUT = 300.0
_POOL_SIZE = 16
_USER_AGENT = "airlock-python/0.1"

Body = Union[None, bytes, Iterable[bytes]]


def default_data_dir() -> str:
    """The daemon's default data directory, resolved as ``airlockd`` does (src/daemon/paths.cc)."""
    if os.geteuid() == 0:
        return "/var/lib/airlock"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, "airlock")
    home = os.environ.get("HOME", "")
    if not home.startswith("/"):
        home = pwd.getpwuid(os.geteuid()).pw_dir
    return os.path.join(home, ".local", "share", "airlock")


def default_socket() -> str:
    """The socket the ``airlock`` CLI talks to: ``$AIRLOCK_SOCKET``, else
    ``$AIRLOCK_DATA_DIR/airlockd.sock``, else the default data dir's."""
    sock = os.environ.get("AIRLOCK_SOCKET")
    if sock:
        return os.path.abspath(sock)
    data_dir = os.environ.get("AIRLOCK_DATA_DIR") or default_data_dir()
    return os.path.join(os.path.abspath(data_dir), "airlockd.sock")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._unix_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Response:
    """A response whose body is read on demand; returns its connection when done."""

    def __init__(self, transport: "Transport", conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse) -> None:
        self._transport = transport
        self._conn: Optional[http.client.HTTPConnection] = conn
        self.raw = resp
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    def read(self) -> bytes:
        """Reads the whole body and releases the connection."""
        try:
            data = self.raw.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise _connection_error(e, self._transport.where) from e
        self._release()
        return data

    def read_chunk(self, size: int = 256 * 1024) -> bytes:
        """Up to ``size`` bytes of the body (b"" at its end, which releases the connection)."""
        try:
            data = self.raw.read1(size) if hasattr(self.raw, "read1") else self.raw.read(size)
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise _connection_error(e, self._transport.where) from e
        if not data:
            self._release()
        return data

    def lines(self) -> Iterator[Dict[str, Any]]:
        """The body as NDJSON objects, one per line, as they arrive."""
        try:
            while True:
                try:
                    line = self.raw.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise _connection_error(e, self._transport.where) from e
                if not line:
                    break
                line = line.strip()
                if line:
                    yield json.loads(line)
            self._release()
        finally:
            self.close()  # no-op once released; an abandoned stream hangs up

    def json(self) -> Any:
        data = self.read()
        return json.loads(data) if data else None

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.raw.isclosed() and not self.raw.will_close:
            self._transport._put(conn)
        else:
            conn.close()

    def abort(self) -> None:
        """Shuts the connection down from any thread: a reader blocked on it wakes up."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Drops the connection (an unread stream ends: the daemon sees a hang-up)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _connection_error(e: BaseException, where: str) -> AirlockError:
    if isinstance(e, socket.timeout):
        return Timeout("timeout", f"no answer from the daemon at {where} in time")
    return DaemonUnavailable("connection", f"cannot talk to the daemon at {where}: {e}")


class Transport:
    """Sends requests to one daemon; thread-safe.

    Args:
        socket_path: the daemon's unix socket (default: :func:`default_socket`).
        url: ``http://host:port`` of a TCP listener instead of the socket
            (default ``$AIRLOCK_URL``).
        token: sent as ``Authorization: Bearer`` (default ``$AIRLOCK_TOKEN``);
            refused (:class:`AirlockError` ``invalid_argument``, field ``url``)
            with a plain ``http`` URL whose host is not a loopback address.
        ca: for ``https``, a PEM file of the CA (or self-signed certificate)
            to verify the daemon against (default ``$AIRLOCK_CA``, else the
            system's CAs); the URL's host must match the certificate.
        timeout: seconds a plain call may take (streams wait as long as needed).
    """

    def __init__(self, socket_path: Optional[str] = None, url: Optional[str] = None,
                 token: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 ca: Optional[str] = None) -> None:
        if socket_path is None and url is None:
            url = os.environ.get("AIRLOCK_URL") or None
        if token is None:
            token = os.environ.get("AIRLOCK_TOKEN") or None
        if ca is None:
            ca = os.environ.get("AIRLOCK_CA") or None
        self.timeout = timeout
        self._token = token
        self._ssl: Optional[ssl.SSLContext] = None
        self._prefix = ""
        self._url: Optional[urllib.parse.SplitResult] = None
        self._socket: Optional[str] = None
        if url is not None:
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise AirlockError("invalid_argument",
                                   f"AIRLOCK_URL must be http://host:port, got {url!r}", "url")
            if u.scheme == "http" and token and not _is_loopback(u.hostname):
                # Plain http carries the token in clear over a network any
                # hop may read: only https, or a loopback address, is safe.
                raise InvalidArgument(
                    "invalid_argument",
                    f"refusing to send a token over plain http to {url}: use https:// (airlockd "
                    "--tls-cert/--tls-key) or a loopback address (127.0.0.1, ::1, localhost)",
                    "url")
            self._url = u
            if u.scheme == "https":
                self._ssl = ssl.create_default_context(cafile=ca)
            self._prefix = u.path.rstrip("/")
            self.where = url
        else:
            self._socket = socket_path or default_socket()
            self.where = self._socket
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._url is not None:
            if self._ssl is not None:
                return http.client.HTTPSConnection(self._url.hostname or "", self._url.port,
                                                   timeout=timeout, context=self._ssl)
            return http.client.HTTPConnection(self._url.hostname or "", self._url.port,
                                              timeout=timeout)
        assert self._socket is not None
        return _UnixConnection(self._socket, timeout)

    def _get(self, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            return self._connect(timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < _POOL_SIZE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Closes the idle connections (in-flight streams keep theirs)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def request(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
                json_body: Any = None, body: Body = None,
                content_type: Optional[str] = None,
                timeout: Union[float, None, str] = "default") -> Response:
        """Sends one request and returns the response once its head arrived.

        Raises the matching :class:`AirlockError` for a 4xx/5xx answer.
        ``timeout=None`` waits forever (streams); ``"default"`` uses the client's.
        """
        t: Optional[float] = self.timeout if timeout == "default" else timeout  # type: ignore
        url = self._prefix + path
        if query:
            url += "?" + urllib.parse.urlencode(
                {k: _query_value(v) for k, v in query.items() if v is not None})
        headers = {"User-Agent": _USER_AGENT, "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        payload: Body = body
        if json_body is not None:
            payload = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif body is not None:
            headers["Content-Type"] = content_type or "application/octet-stream"
        if isinstance(payload, (bytes, bytearray)):
            headers["Content-Length"] = str(len(payload))
        elif payload is not None:
            headers["Transfer-Encoding"] = "chunked"
        replayable = payload is None or isinstance(payload, (bytes, bytearray))
        while True:
            conn, reused = self._get(t)
            try:
                conn.request(method, url, body=payload, headers=headers,
                             encode_chunked=not replayable)
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                # A kept-alive connection the daemon closed while idle: the
                # request never reached it, so sending it again is safe.
                if reused and replayable:
                    conn.close()
                    continue
                # The daemon may have answered (e.g. 404, 413) and stopped
                # reading a body still being sent: its answer is the error.
                resp = _answer_after_broken_send(conn)
                if resp is None:
                    conn.close()
                    raise _connection_error(e, self.where) from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise _connection_error(e, self.where) from e
            break
        r = Response(self, conn, resp)
        if r.status >= 400:
            data = r.read()
            try:
                parsed: Any = json.loads(data)
            except ValueError:
                parsed = data
            raise error_from_body(r.status, parsed)
        return r

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """:meth:`request`, then the body parsed as JSON (``None`` when empty)."""
        return self.request(method, path, **kw).json()


def _answer_after_broken_send(conn: http.client.HTTPConnection
                              ) -> Optional[http.client.HTTPResponse]:
    if conn.sock is None:
        return None
    try:
        conn._HTTPConnection__state = http.client._CS_REQ_SENT  # type: ignore[attr-defined]
        return conn.getresponse()
    except (OSError, http.client.HTTPException):
        return None


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a URL's hostname) is this machine's loopback: never
    resolved, so a name that merely points at 127.0.0.1 does not count."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def quote_segment(s: str) -> str:
    """``s`` as one URL path segment (the daemon then names it in its error)."""
    return urllib.parse.quote(str(s), safe="")


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
