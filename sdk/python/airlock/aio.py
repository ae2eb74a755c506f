"""asyncio front end: :class:`AsyncSandbox` has the shape of :class:`Sandbox`.

Each call runs the blocking SDK call in a worker thread
(``asyncio.to_thread``), so the event loop never waits on the socket; streams
are async iterators that fetch one event per thread hop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Generator, Dict, List, Mapping, Optional, TypeVar

from .sandbox import Client, Process, Sandbox
from .types import ExecResult, FileEntry

T = TypeVar("T")
_END = object()


async def _run(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    return await asyncio.to_thread(fn, *args, **kw)


class AsyncStream:
    """An async iterator over a blocking SDK stream (exec output, watch, events).

    ``await`` it to open the stream before iterating (for a watch: the watch
    is then in place), or just ``async for`` over it. Leaving early closes it.
    Attributes of the underlying stream (``result``, ``exec_id``, ``path``)
    are readable once it is open.
    """

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._it: Any = None

    async def _open(self) -> "AsyncStream":
        if self._it is None:
            self._it = await _run(self._make)
        return self

    def __await__(self) -> Generator[Any, None, "AsyncStream"]:
        return self._open().__await__()

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Any:
        await self._open()

        def step() -> Any:
            try:
                return next(self._it)
            except StopIteration:
                return _END

        item = await _run(step)
        if item is _END:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        """Closes the stream (an exec still running is killed)."""
        if self._it is not None:
            await _run(self._it.close)

    async def __aenter__(self) -> "AsyncStream":
        return await self._open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or self.__dict__.get("_it") is None:
            raise AttributeError(name)
        return getattr(self._it, name)


class AsyncProcess:
    """A background exec (see :class:`Process`), awaitable."""

    def __init__(self, proc: Process) -> None:
        self.sync = proc
        self.id = proc.id
        self.pid = proc.pid

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Waits for it to end; :class:`Timeout` after ``timeout`` seconds."""
        return await _run(self.sync.wait, timeout)

    async def kill(self, signal: int = 9) -> None:
        """Sends ``signal`` to the process tree."""
        await _run(self.sync.kill, signal)

    async def status(self) -> Dict[str, Any]:
        return await _run(self.sync.status)


class AsyncFiles:
    """``sb.files`` of an :class:`AsyncSandbox`."""

    def __init__(self, sb: Sandbox) -> None:
        self._f = sb.files

    async def write(self, path: str, data: Any, mode: int = 0o644) -> int:
        return await _run(self._f.write, path, data, mode)

    async def read(self, path: str) -> bytes:
        return await _run(self._f.read, path)

    async def list(self, path: str) -> List[FileEntry]:
        return await _run(self._f.list, path)

    async def stat(self, path: str) -> FileEntry:
        return await _run(self._f.stat, path)

    async def mkdir(self, path: str, parents: bool = False) -> None:
        await _run(self._f.mkdir, path, parents)

    async def remove(self, path: str, recursive: bool = False) -> None:
        await _run(self._f.remove, path, recursive)

    def watch(self, path: str, recursive: bool = True) -> AsyncStream:
        """An :class:`AsyncStream` of :class:`WatchEvent`; after
        ``w = await sb.files.watch(p)`` the watch is in place (see :meth:`Files.watch`)."""
        return AsyncStream(lambda: self._f.watch(path, recursive))


class AsyncNetwork:
    """``sb.network`` of an :class:`AsyncSandbox`."""

    def __init__(self, sb: Sandbox) -> None:
        self._n = sb.network

    async def get(self) -> Dict[str, Any]:
        return await _run(self._n.get)

    async def set(self, mode: Optional[str] = None, allow: Optional[List[str]] = None,
                  deny: Optional[List[str]] = None) -> Dict[str, Any]:
        return await _run(self._n.set, mode, allow, deny)

    async def events(self) -> List[Dict[str, Any]]:
        return await _run(self._n.events)

    def follow_events(self) -> AsyncStream:
        """An :class:`AsyncStream` of network events, also new ones, until the sandbox ends."""
        return AsyncStream(lambda: self._n.events(follow=True))


class AsyncPorts:
    """``sb.ports`` of an :class:`AsyncSandbox`."""

    def __init__(self, sb: Sandbox) -> None:
        self._p = sb.ports

    async def add(self, guest_port: int, host_port: int = 0) -> Dict[str, Any]:
        return await _run(self._p.add, guest_port, host_port)

    async def list(self) -> List[Dict[str, Any]]:
        return await _run(self._p.list)

    async def remove(self, host_port: int) -> None:
        await _run(self._p.remove, host_port)


class AsyncSandbox:
    """The asyncio twin of :class:`Sandbox`::

        async with await AsyncSandbox.create(image="minimal") as sb:
            r = await sb.exec("echo", "hi")
            async for ev in sb.exec_stream("sh", "-c", "echo a; echo b >&2"):
                print(ev.stream, ev.data)
    """

    def __init__(self, sync: Sandbox) -> None:
        self.sync = sync
        self.id = sync.id
        self.files = AsyncFiles(sync)
        self.network = AsyncNetwork(sync)
        self.ports = AsyncPorts(sync)

    @property
    def info(self) -> Dict[str, Any]:
        return self.sync.info

    @classmethod
    async def create(cls, image: Optional[str] = None, **kw: Any) -> "AsyncSandbox":
        """See :meth:`Sandbox.create`."""
        return cls(await _run(Sandbox.create, image, **kw))

    @classmethod
    async def connect(cls, sandbox_id: str, client: Optional[Client] = None) -> "AsyncSandbox":
        """See :meth:`Sandbox.connect`."""
        return cls(await _run(Sandbox.connect, sandbox_id, client))

    @classmethod
    async def list(cls, metadata: Optional[Mapping[str, str]] = None, all: bool = False,
                   client: Optional[Client] = None) -> List["AsyncSandbox"]:
        """See :meth:`Sandbox.list`."""
        return [cls(s) for s in await _run(Sandbox.list, metadata, all, client)]

    async def refresh(self) -> Dict[str, Any]:
        return await _run(self.sync.refresh)

    async def destroy(self) -> None:
        """See :meth:`Sandbox.destroy`."""
        await _run(self.sync.destroy)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await _run(self.sync.__exit__, *exc)

    async def exec(self, *argv: str, background: bool = False, **kw: Any) -> Any:
        """See :meth:`Sandbox.exec`; returns an :class:`ExecResult` or, with
        ``background=True``, an :class:`AsyncProcess`."""
        r = await _run(self.sync.exec, *argv, background=background, **kw)
        return AsyncProcess(r) if isinstance(r, Process) else r

    def exec_stream(self, *argv: str, **kw: Any) -> AsyncStream:
        """An :class:`AsyncStream` of :class:`ExecEvent`; ``.result`` once it
        ended. Leaving it early kills the process."""
        return AsyncStream(lambda: self.sync.exec_stream(*argv, **kw))

    async def logs(self) -> List[Dict[str, Any]]:
        return await _run(self.sync.logs)

    async def guest_info(self) -> Dict[str, Any]:
        return await _run(self.sync.guest_info)


__all__ = [
    "AsyncSandbox", "AsyncStream", "AsyncProcess", "AsyncFiles", "AsyncNetwork", "AsyncPorts",
]
