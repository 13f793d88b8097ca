"""Fresh processes for tests: the real `ftrain` console script, a fresh interpreter's imports, a free port, the
marks of a test's own attempt."""

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def ftrain_process(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real `ftrain` console script."""
    script = Path(sys.executable).with_name("ftrain")
    return subprocess.run(
        [str(script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def modules_imported_by(modules: Iterable[str]) -> set[str]:
    """Every module a fresh interpreter holds after importing `modules`: what a layering test asserts on."""
    code = "import importlib, json, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\nprint(json.dumps([*sys.modules]))"
    result = subprocess.run(
        [sys.executable, "-c", code, *modules], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_marks(run_id: str, attempt: int) -> dict[str, str]:
    """What a test knows of an attempt it started: the run and the number (the nonce is its supervisor's), to
    find its processes with `attempt_processes`. Enough while no other test runs the same run id at once."""
    return {"FTRAIN_RUN_ID": run_id, "FTRAIN_ATTEMPT": str(attempt)}
