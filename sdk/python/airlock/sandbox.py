"""Sandbox, the SDK's main handle, and what its execs return."""

from __future__ import annotations

import base64
import threading
import time
from typing import (IO, Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Union,
                    overload)

from ._resources import Files, Network, Ports, read_chunks
from ._transport import Response, Transport, quote_segment
from .errors import (AirlockError, Conflict, InvalidArgument, NotFound, RouteNotFound,
                     SandboxFailed, Timeout, Unsupported, error_from_body)
from .types import ExecEvent, ExecResult

Stdin = Union[None, bytes, bytearray, str, IO[bytes], Iterable[bytes]]

_default_lock = threading.Lock()
_default: Optional["Client"] = None


class Client:
    """A connection to one daemon, shared by the sandboxes it returns; thread-safe.

    With no arguments it talks to ``$AIRLOCK_URL`` (with ``$AIRLOCK_TOKEN``)
    if set, else to the local daemon's unix socket as the ``airlock`` CLI
    finds it (``$AIRLOCK_SOCKET``, ``$AIRLOCK_DATA_DIR``, the default data dir).
    """

    def __init__(self, socket: Optional[str] = None, url: Optional[str] = None,
                 token: Optional[str] = None, timeout: float = 300.0,
                 ca: Optional[str] = None) -> None:
        self.transport = Transport(socket, url, token, timeout, ca)

    def info(self) -> Dict[str, Any]:
        """The daemon's ``/v1/info``: version, accelerator, images, limits."""
        return dict(self.transport.call("GET", "/v1/info"))

    def close(self) -> None:
        """Closes idle connections."""
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def default_client() -> Client:
    """The process-wide :class:`Client` used when a call is given none."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def _exec_body(argv: Sequence[str], cmd: Optional[str], cwd: Optional[str],
               env: Optional[Mapping[str, str]], user: Union[str, int, None],
               timeout: Optional[float], limits: Optional[Mapping[str, Any]],
               output_limit_bytes: Optional[int]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if cmd is not None:
        if argv:
            raise InvalidArgument("invalid_argument", "give either argv or cmd, not both", "argv")
        body["cmd"] = cmd
    else:
        body["argv"] = [str(a) for a in argv]
    for k, v in (("cwd", cwd), ("user", user), ("timeout", timeout),
                 ("output_limit_bytes", output_limit_bytes)):
        if v is not None:
            body[k] = v
    if env is not None:
        body["env"] = dict(env)
    if limits is not None:
        body["limits"] = dict(limits)
    return body


class ExecStream:
    """The output of a running exec, event by event.

    Iterate it for :class:`ExecEvent` (``.stream``, ``.data``) in the order the
    process wrote them; when the iteration ends, :attr:`result` has how the
    process ended (its ``stdout``/``stderr`` are empty: the events carried
    them). Closing it early (``break`` then ``close()``, or leaving a ``with``
    block) hangs up, and the daemon kills the process.
    """

    def __init__(self, sandbox: "Sandbox", resp: Response) -> None:
        self._sb = sandbox
        self._resp = resp
        self._lines = resp.lines()
        self.result: Optional[ExecResult] = None
        self.exec_id = ""
        self.pid = 0
        self._stdout: Optional[bytearray] = None
        self._stderr: Optional[bytearray] = None
        self._uploader: Optional[threading.Thread] = None
        self._upload_error: Optional[BaseException] = None
        self._pending: Optional[Dict[str, Any]] = None  # read by _start, not yet handled

    def _start_upload(self, upload: Callable[[], Any]) -> None:
        """Feeds the process's stdin from a thread while the output is read."""

        def run() -> None:
            try:
                upload()
            except Conflict as e:
                # stdin was closed: the process ended before reading all of
                # it (head -c 1). Its result says how it ended.
                self._upload_error = e
            except BaseException as e:
                self._upload_error = e
                # Without EOF the process would wait for stdin forever: hang
                # up on its output too, which kills it.
                self._resp.abort()

        self._uploader = threading.Thread(target=run, name=f"airlock-stdin-{self.exec_id}",
                                          daemon=True)
        self._uploader.start()

    def _finish_upload(self) -> None:
        """Raises what went wrong with the stdin upload, if anything did."""
        if self._uploader is None:
            return
        # An upload the daemon stopped reading (the process ended) ends when
        # the daemon closes it; do not wait on it forever.
        self._uploader.join(30)
        self._uploader = None
        e = self._upload_error
        if e is None or isinstance(e, Conflict):
            return
        if isinstance(e, RouteNotFound):
            raise Unsupported("unsupported", "this daemon cannot stream stdin: " + e.message,
                              "stdin") from e
        raise e

    def _start(self) -> None:
        """Reads up to the start event (so exec_id is known)."""
        j = self._next()
        if j is None or j.get("type") != "start":
            self._pending = j
        else:
            self.exec_id, self.pid = str(j.get("exec_id", "")), int(j.get("pid") or 0)
            self._pending = None

    def _next(self) -> Optional[Dict[str, Any]]:
        try:
            return next(self._lines)
        except StopIteration:
            return None
        except AirlockError:
            self._finish_upload()  # a failed upload hung up: report its cause
            raise

    def __iter__(self) -> "ExecStream":
        return self

    def __next__(self) -> ExecEvent:
        while True:
            j, self._pending = (self._pending or self._next()), None
            if j is None:
                self._finish_upload()
                if self.result is None:
                    raise self._sb._explain(AirlockError(
                        "guest_error", "the exec stream ended without an exit event"))
                raise StopIteration
            t = j.get("type")
            if t in ("stdout", "stderr"):
                ev = ExecEvent.from_json(j)
                if self._stdout is not None and self._stderr is not None:
                    (self._stdout if t == "stdout" else self._stderr).extend(ev.data)
                return ev
            if t == "start":
                self.exec_id, self.pid = str(j.get("exec_id", "")), int(j.get("pid") or 0)
            elif t == "exit":
                out = bytes(self._stdout) if self._stdout is not None else b""
                err = bytes(self._stderr) if self._stderr is not None else b""
                self.result = ExecResult.from_json(j, out, err)
            elif t == "error":
                self.close()
                self._finish_upload()
                raise self._sb._explain(error_from_body(None, j))

    def wait(self) -> ExecResult:
        """Reads the rest of the output and returns the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        """Hangs up; a process still running is killed by the daemon."""
        self._lines.close()
        self._resp.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Process:
    """A background exec: it runs on in the guest until it ends or is killed.

    Its output is not kept by the daemon; redirect it to a file in the guest
    if you need it.
    """

    def __init__(self, sandbox: "Sandbox", status: Dict[str, Any]) -> None:
        self._sb = sandbox
        self.id: str = str(status["exec_id"])
        self.pid: int = int(status.get("pid") or 0)
        self.argv: List[str] = list(status.get("argv") or [])
        self._status = status

    def status(self) -> Dict[str, Any]:
        """The daemon's current view: running, exit_code, reason, ..."""
        self._status = self._sb._call("GET", f"/exec/{quote_segment(self.id)}")
        return self._status

    @property
    def running(self) -> bool:
        """Whether it still runs (asks the daemon)."""
        return bool(self.status().get("running"))

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for it to end and returns the result (without output).

        Raises :class:`Timeout` if it still runs after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
            st = self._sb._call("GET", f"/exec/{quote_segment(self.id)}",
                                query={"wait": f"{step:.3f}"},
                                timeout=step + 60)
            self._status = st
            if not st.get("running"):
                return ExecResult.from_json(st, output_captured=False)
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout("timeout", f"exec {self.id} still runs after {timeout} s")

    def kill(self, signal: int = 9) -> None:
        """Sends ``signal`` (default SIGKILL) to the process tree."""
        self._sb._call("DELETE", f"/exec/{quote_segment(self.id)}", query={"signal": signal})

    def __repr__(self) -> str:
        return f"Process(id={self.id!r}, argv={self.argv!r})"


class Sandbox:
    """One microVM sandbox. Use :meth:`create`, :meth:`connect` or :meth:`list`.

    As a context manager it is destroyed when the block ends::

        with Sandbox.create(image="minimal") as sb:
            print(sb.exec("echo", "hi").stdout)
    """

    def __init__(self, info: Dict[str, Any], client: Optional[Client] = None) -> None:
        self.client = client or default_client()
        self._t = self.client.transport
        self.id: str = str(info["id"])
        self.info: Dict[str, Any] = info
        self._base = "/v1/sandboxes/" + quote_segment(self.id)
        self.files = Files(self._t, self.id, self._explain)
        self.network = Network(self._t, self.id, self._explain)
        self.ports = Ports(self._t, self.id, self._explain)

    # --- lifecycle -------------------------------------------------------

    @classmethod
    def create(cls, image: Optional[str] = None, *, cpus: Optional[int] = None,
               memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
               timeout: Optional[int] = None, idle_timeout: Optional[int] = None,
               env: Optional[Mapping[str, str]] = None,
               metadata: Optional[Mapping[str, str]] = None,
               network: Optional[Mapping[str, Any]] = None,
               client: Optional[Client] = None) -> "Sandbox":
        """Boots a sandbox and returns it running.

        Args:
            image: guest image (daemon default: ``minimal``).
            cpus, memory_mb, disk_mb: the VM's shape.
            timeout: life in seconds, after which it is destroyed.
            idle_timeout: destroyed after this long with nothing running.
            env: environment defaults for every exec.
            metadata: free-form labels (filter for :meth:`list`).
            network: egress policy ``{"mode": "none"|"allowlist"|"open",
                "allow": [...], "deny": [...]}``.
        """
        c = client or default_client()
        spec: Dict[str, Any] = {}
        for k, v in (("image", image), ("cpus", cpus), ("memory_mb", memory_mb),
                     ("disk_mb", disk_mb), ("timeout", timeout), ("idle_timeout", idle_timeout)):
            if v is not None:
                spec[k] = v
        for k, m in (("env", env), ("metadata", metadata), ("network", network)):
            if m is not None:
                spec[k] = dict(m)
        info = c.transport.call("POST", "/v1/sandboxes", json_body=spec,
                                timeout=max(c.transport.timeout, 600))
        return cls(info, c)

    @classmethod
    def connect(cls, sandbox_id: str, client: Optional[Client] = None) -> "Sandbox":
        """A handle on an existing sandbox; :class:`SandboxNotFound` if there is none."""
        c = client or default_client()
        return cls(c.transport.call("GET", "/v1/sandboxes/" + quote_segment(sandbox_id)), c)

    @classmethod
    def list(cls, metadata: Optional[Mapping[str, str]] = None, all: bool = False,
             client: Optional[Client] = None) -> List["Sandbox"]:
        """Sandboxes whose metadata has every given key/value (live ones, or
        also ended ones with ``all=True``)."""
        c = client or default_client()
        q: Dict[str, Any] = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
        if all:
            q["all"] = True
        return [cls(i, c) for i in c.transport.call("GET", "/v1/sandboxes", query=q)]

    def refresh(self) -> Dict[str, Any]:
        """Re-reads :attr:`info` from the daemon and returns it."""
        self.info = self._t.call("GET", f"{self._base}")
        return self.info

    @property
    def state(self) -> str:
        """``running``, ``failed``, ``timed_out``, ``deleted``, ... (asks the daemon)."""
        return str(self.refresh().get("state"))

    @property
    def metadata(self) -> Dict[str, str]:
        return dict(self.info.get("metadata") or {})

    def destroy(self) -> None:
        """Stops the VM and removes everything of it but its audit journal."""
        self._t.call("DELETE", f"{self._base}")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.destroy()
        except (NotFound, Conflict):
            pass  # already ended (failed, timed out, deleted by someone else)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, image={self.info.get('image')!r})"

    # --- exec ----------------------------------------------------------

    @overload
    def exec(self, *argv: str, cmd: Optional[str] = ..., cwd: Optional[str] = ...,
             env: Optional[Mapping[str, str]] = ..., user: Union[str, int, None] = ...,
             timeout: Optional[float] = ..., stdin: Stdin = ...,
             limits: Optional[Mapping[str, Any]] = ...,
             output_limit_bytes: Optional[int] = ...,
             background: Literal[False] = ...) -> ExecResult: ...

    @overload
    def exec(self, *argv: str, cmd: Optional[str] = ..., cwd: Optional[str] = ...,
             env: Optional[Mapping[str, str]] = ..., user: Union[str, int, None] = ...,
             timeout: Optional[float] = ..., stdin: Stdin = ...,
             limits: Optional[Mapping[str, Any]] = ...,
             output_limit_bytes: Optional[int] = ...,
             background: Literal[True]) -> "Process": ...

    def exec(self, *argv: str, cmd: Optional[str] = None, cwd: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None, user: Union[str, int, None] = None,
             timeout: Optional[float] = None, stdin: Stdin = None,
             limits: Optional[Mapping[str, Any]] = None,
             output_limit_bytes: Optional[int] = None,
             background: bool = False) -> Union[ExecResult, "Process"]:
        """Runs ``argv`` (or the shell string ``cmd``) in the sandbox.

        Returns an :class:`ExecResult` when it ends, or at once a
        :class:`Process` with ``background=True``. ``stdin`` may be bytes, a
        str (sent as UTF-8) or a binary file, which is streamed in pieces
        (bounded memory, any size), or an iterable of bytes (each piece sent
        as it is produced). ``timeout`` kills it after that many
        seconds (``result.reason == "timeout"``). ``limits`` caps the exec's
        own cgroup: ``{"pids", "memory_mb", "cpu_seconds"}``.
        """
        body = _exec_body(argv, cmd, cwd, env, user, timeout, limits, output_limit_bytes)
        if stdin is not None and not isinstance(stdin, (bytes, bytearray, str)):
            return self._exec_stdin_stream(body, stdin, background)
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif stdin is not None:
            body["stdin_b64"] = base64.b64encode(bytes(stdin)).decode()
        if background:
            body["background"] = True
            return Process(self, self._call("POST", "/exec", json_body=body))
        s = self._open_exec(body)
        s._stdout, s._stderr = bytearray(), bytearray()
        return s.wait()

    def exec_stream(self, *argv: str, cmd: Optional[str] = None, cwd: Optional[str] = None,
                    env: Optional[Mapping[str, str]] = None,
                    user: Union[str, int, None] = None, timeout: Optional[float] = None,
                    stdin: Stdin = None,
                    limits: Optional[Mapping[str, Any]] = None,
                    output_limit_bytes: Optional[int] = None) -> ExecStream:
        """Like :meth:`exec`, but returns at once an :class:`ExecStream` that
        yields the output as the process writes it. A file or iterable
        ``stdin`` is sent as it is read, so an interactive program answers
        each piece while the next is still to come."""
        body = _exec_body(argv, cmd, cwd, env, user, timeout, limits, output_limit_bytes)
        if stdin is not None and not isinstance(stdin, (bytes, bytearray, str)):
            return self._open_exec_streaming_stdin(body, stdin)
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif stdin is not None:
            body["stdin_b64"] = base64.b64encode(bytes(stdin)).decode()
        return self._open_exec(body)

    def processes(self) -> List[Process]:
        """The background execs of this sandbox (running and ended)."""
        return [Process(self, s) for s in self._call("GET", "/exec")]

    def _open_exec(self, body: Dict[str, Any]) -> ExecStream:
        try:
            r = self._t.request("POST", f"{self._base}/exec", json_body=body,
                                timeout=None)
        except AirlockError as e:
            raise self._explain(e) from None
        s = ExecStream(self, r)
        s._start()
        return s

    def _open_exec_streaming_stdin(self, body: Dict[str, Any], stdin: Any) -> ExecStream:
        """Starts the exec (``stdin_stream``) and a thread uploading ``stdin``
        into it while the caller reads the output."""
        try:
            s = self._open_exec(dict(body, stdin_stream=True))
        except InvalidArgument as e:
            if e.field == "stdin_stream" and "unknown" in e.message:
                raise Unsupported("unsupported", "this daemon cannot stream stdin: " + e.message,
                                  "stdin") from None
            raise
        s._start_upload(lambda: self._upload_stdin(s.exec_id, stdin))
        return s

    def _exec_stdin_stream(self, body: Dict[str, Any], stdin: Any,
                           background: bool) -> Any:
        """Contract 1: start the exec with ``stdin_stream``, then upload
        ``stdin`` to ``.../exec/{exec_id}/stdin?eof=true`` as a chunked body."""
        body = dict(body, stdin_stream=True)
        if not background:
            s = self._open_exec_streaming_stdin(body, stdin)
            s._stdout, s._stderr = bytearray(), bytearray()
            try:
                return s.wait()
            finally:
                s.close()
        body["background"] = True
        try:
            st = self._call("POST", "/exec", json_body=body)
        except InvalidArgument as e:
            if e.field == "stdin_stream" and "unknown" in e.message:
                raise Unsupported("unsupported", "this daemon cannot stream stdin: " + e.message,
                                  "stdin") from None
            raise
        p = Process(self, st)
        try:
            self._upload_stdin(p.id, stdin)
        except RouteNotFound as e:
            p.kill()
            raise Unsupported("unsupported", "this daemon cannot stream stdin: " + e.message,
                              "stdin") from e
        return p

    def _upload_stdin(self, exec_id: str, stdin: Any) -> Dict[str, Any]:
        path = f"{self._base}/exec/{exec_id}/stdin"
        # An empty append first: a daemon without the route says so (404)
        # before any of a large body is sent.
        try:
            self._t.call("POST", path, body=b"")
        except InvalidArgument:
            pass  # a daemon that wants a body: the route exists, which is all we asked
        chunks = read_chunks(stdin) if hasattr(stdin, "read") else (bytes(c) for c in stdin)
        return dict(self._t.call("POST", path, query={"eof": True}, body=chunks,
                                 timeout=None))

    # --- the rest --------------------------------------------------------

    def logs(self) -> List[Dict[str, Any]]:
        """The sandbox's audit journal: one dict per event (``event``, ``ts``, ...)."""
        return list(self._call("GET", "/logs"))

    def guest_info(self) -> Dict[str, Any]:
        """What the guest reports about itself: kernel, uptime, memory, disk."""
        return dict(self._call("GET", "/info"))

    def posture(self) -> Dict[str, Any]:
        """The VM's isolation as read back from the host (jail, cgroup, accel)."""
        return dict(self._call("GET", "/posture"))

    def _call(self, method: str, sub: str, **kw: Any) -> Any:
        try:
            return self._t.call(method, f"{self._base}{sub}", **kw)
        except AirlockError as e:
            raise self._explain(e) from None

    def _explain(self, e: AirlockError) -> AirlockError:
        """Turns an error caused by the sandbox having failed into :class:`SandboxFailed`."""
        if isinstance(e, (InvalidArgument, NotFound, SandboxFailed)):
            return e
        try:
            info = self._t.call("GET", f"{self._base}")
        except AirlockError:
            return e
        if info.get("state") != "failed":
            return e
        self.info = info
        failure, reason = str(info.get("failure", "")), str(info.get("reason", ""))
        return SandboxFailed(e.code, e.message or f"sandbox {self.id} failed ({failure}): {reason}",
                             e.field, e.status, sandbox_id=self.id, failure=failure, reason=reason)
