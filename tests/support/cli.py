"""The CLI in this process for tests: `Cli` runs `ftrain ARGS` through `main` and captures what it printed
(the `cli` fixture of tests/conftest.py makes one), and the seed scenario's commands."""

import asyncio
import json
from pathlib import Path

import pytest

from ftrain.cli.main import main
from tests.support.servers import last_seq_at

RUN = "dist-JPCP-2x4"
TIME = r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ"
"""RFC 3339, UTC: the one form every human view shows a time in."""


def ckpt_args(step: str, epoch: str, shards: str, *source: str) -> tuple[str, ...]:
    return ("checkpoint", RUN, "--step", step, "--epoch", epoch, "--shards", shards, *source)


class Cli:
    """Runs `ftrain ARGS` in this process and captures exit code, stdout and stderr."""

    def __init__(self, capsys: pytest.CaptureFixture[str], env: dict[str, str]) -> None:
        self.capsys, self.env = capsys, env

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *args: str) -> list[str]:
        code, out, err = self(*args)
        assert (code, err) == (0, ""), f"ftrain {' '.join(args)} → {code}: {err}"
        return out.splitlines()

    def last_seq(self) -> int:
        return asyncio.run(last_seq_at(self.env["FTRAIN_NATS_URL"], self.env["FTRAIN_NATS_NKEY"]))

    def storage(self) -> Path:
        return Path(self.env["FTRAIN_STORAGE"])


def launch(cli: Cli, *extra: str) -> list[str]:
    return cli.ok(
        "launch", "JPCP", "--nodes", "2", "--gpus-per-node", "4", "--nodelist", "node[07-08]", *extra
    )


def checkpoint(cli: Cli, step: int, epoch: int, run_id: str = RUN) -> list[str]:
    state = json.dumps({"optimizer": "adam", "lr": 0.0003, "step": step})
    return cli.ok(
        "checkpoint", run_id, "--step", str(step), "--epoch", str(epoch), "--shards", "8", "--state", state
    )
