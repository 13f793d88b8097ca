"""`ftrain ui` as a process for tests: started on a free port against the test's log, the URL it printed
read back, stopped with SIGTERM (and its exit code and stderr kept)."""

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import msgspec


class Ui(msgspec.Struct):
    """A running view: the URL with its token, the base URL, the token, and after it stopped its exit code
    and what it wrote on stderr."""

    url: str
    base: str
    token: str
    proc: subprocess.Popen[str]
    returncode: int | None = None
    stderr: str = ""


@contextmanager
def serving(env: dict[str, str], *args: str) -> Iterator[Ui]:
    """`ftrain ui --port 0 ARGS…` until the block ends."""
    import os

    script = Path(sys.executable).with_name("ftrain")
    proc = subprocess.Popen([str(script), "ui", "--port", "0", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    url = proc.stdout.readline().strip()
    if not url:
        proc.wait(10)
        raise AssertionError(f"ftrain ui exited {proc.returncode}: {proc.stderr.read()}")
    parts = urlsplit(url)
    ui = Ui(url, f"{parts.scheme}://{parts.netloc}", parts.query.removeprefix("token="), proc)
    try:
        yield ui
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, ui.stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, ui.stderr = proc.communicate()
        ui.returncode = proc.returncode
