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


def test_a_scripts_warning_is_one_line_for_people_said_once_for_the_job() -> None:
    """Unconfigured, without FTRAIN_LOG_LEVEL: rank 0 says a warning in one plain line, other ranks only
    errors (a torchrun job of 8 ranks printed each warning 8 times, as JSON)."""
    script = "import structlog; import ftrain; structlog.get_logger('t').warning('loader_not_resumable', loader='DL')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTRAIN_")}
    said = [
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env={**env, "RANK": rank},
            check=True,
        ).stderr
        for rank in ("0", "1")
    ]
    assert said == ["ftrain: warning: loader_not_resumable (loader=DL)\n", ""]


def test_configure_reaches_a_logger_that_already_logged() -> None:
    """A script that logged before it asked for more (`configure(level=INFO)`) sees its later info lines: a
    logger cached on first use kept the quiet default's level and format."""
    script = (
        "import logging, structlog; from ftrain import logs; log = structlog.get_logger('t'); "
        "log.info('before'); logs.configure(logging.INFO); log.info('after', n=1)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTRAIN_")}
    said = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    ).stderr.splitlines()
    lines = [json.loads(line) for line in said]
    assert [(line["event"], line["level"], line["n"]) for line in lines] == [("after", "info", 1)]
