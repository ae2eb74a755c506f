"""Plain result types returned by the SDK."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass
class ExecResult:
    """How an exec ended, with its captured output.

    ``reason`` is one of ``exited``, ``signaled``, ``timeout``, ``killed``,
    ``pids_limit``, ``oom_killed``, ``cpu_limit``, ``no_space``. ``truncated``
    is set when output past ``output_limit_bytes`` was dropped (counted in
    ``stdout_dropped`` / ``stderr_dropped``). A background exec's result has
    no output (the daemon does not keep it).
    """

    exec_id: str
    exit_code: Optional[int]
    reason: str
    stdout: bytes = b""
    stderr: bytes = b""
    signal: Optional[int] = None
    timed_out: bool = False
    duration_ms: int = 0
    truncated: bool = False
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    stdin_bytes: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    #: False when the output could not be captured (stdin streamed to a daemon
    #: that only streams stdin into background execs).
    output_captured: bool = True

    @property
    def ok(self) -> bool:
        """True when the process exited with status 0."""
        return self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        """stderr decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, j: Dict[str, Any], stdout: bytes = b"", stderr: bytes = b"",
                  output_captured: bool = True) -> "ExecResult":
        return cls(exec_id=str(j.get("exec_id", "")), exit_code=j.get("exit_code"),
                   reason=str(j.get("reason", "")), stdout=stdout, stderr=stderr,
                   signal=j.get("signal"), timed_out=bool(j.get("timed_out", False)),
                   duration_ms=int(j.get("duration_ms") or 0),
                   truncated=bool(j.get("truncated", False)),
                   stdout_dropped=int(j.get("stdout_dropped") or 0),
                   stderr_dropped=int(j.get("stderr_dropped") or 0),
                   stdin_bytes=int(j.get("stdin_bytes") or 0),
                   stdout_bytes=int(j.get("stdout_bytes") or 0),
                   stderr_bytes=int(j.get("stderr_bytes") or 0),
                   output_captured=output_captured)


@dataclass
class ExecEvent:
    """One piece of an exec's output: ``stream`` is ``"stdout"`` or ``"stderr"``."""

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "ExecEvent":
        return cls(stream=j["type"], data=base64.b64decode(j.get("data", "")))


@dataclass
class FileEntry:
    """A directory entry or stat result: ``type`` is ``file``, ``dir``, ``symlink``, ..."""

    name: str
    type: str
    size: int = 0
    mode: int = 0
    mtime: float = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_dir(self) -> bool:
        return self.type in ("dir", "directory")

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "FileEntry":
        return cls(name=str(j.get("name", j.get("path", ""))), type=str(j.get("type", "")),
                   size=int(j.get("size") or 0), mode=int(j.get("mode") or 0),
                   mtime=j.get("mtime") or 0, raw=j)


@dataclass
class WatchEvent:
    """A change seen by :meth:`Files.watch`.

    ``type`` is ``created``, ``modified``, ``deleted``, ``renamed`` (with
    ``old_path``) or ``overflow`` (the guest's bounded queue dropped
    ``dropped`` events).
    """

    type: str
    path: str = ""
    old_path: Optional[str] = None
    is_dir: bool = False
    dropped: int = 0

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "WatchEvent":
        return cls(type=str(j.get("type", "")), path=str(j.get("path", "")),
                   old_path=j.get("old_path"), is_dir=bool(j.get("is_dir", False)),
                   dropped=int(j.get("dropped") or 0))

