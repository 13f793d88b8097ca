"""Log lines on stderr: the ranks of a job share one stderr pipe, and every line must reach it whole."""

import json
import os
import subprocess
import sys

LOGGER = """
import structlog
from ftrain import logs
logs.configure()
log = structlog.get_logger("t")
for i in range(2000):
    log.warning("line", rank={rank}, i=i, pad="x" * 100)
"""


def test_two_processes_logging_to_one_unbuffered_pipe_never_glue_their_lines() -> None:
    """With stderr unbuffered each `write` reaches the pipe at once: a line written in two parts (the text, then
    its newline) could be followed by the other process's line before its newline."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FTRAIN_LOG_LEVEL": "warning"}
    read, write = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", LOGGER.format(rank=rank)], stderr=write, env=env)
        for rank in (0, 1)
    ]
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        lines = pipe.read().decode().splitlines()
    assert [proc.wait() for proc in procs] == [0, 0]
    parsed = [json.loads(line) for line in lines]
    assert sorted((p["rank"], p["i"]) for p in parsed) == [(r, i) for r in (0, 1) for i in range(2000)]
