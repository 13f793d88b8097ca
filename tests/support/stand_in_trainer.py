"""The stand-in trainer of the `ftrain run` tests, and their `cli` and `trainer` fixtures.

The stand-in imports no torch: it counts its starts in a file, follows one action list per start, and records
its checkpoints through the ftrain CLI so the run's event sequence stays legal. A test module takes the
fixtures with `from tests.support.stand_in_trainer import cli as cli, trainer as trainer`."""

import json
from pathlib import Path

import pytest

from tests.support.cli import Cli

RUN = "dist-P-1x1"
ONE_GPU = ("--nodes", "1", "--gpus-per-node", "1")


TRAINER = '''
"""Stand-in trainer: python trainer.py STATE_DIR ACTIONS_OF_START_1 ACTIONS_OF_START_2 ...

It records no `resumed`: the supervisor opens each relaunch's attempt with one itself."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

state, plans = Path(sys.argv[1]), sys.argv[2:]
if os.environ["RANK"] != "0":
    sys.exit(0)
counter = state / "starts"
start = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(start))
keys = ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_NATS_URL", "TORCHELASTIC_RESTART_COUNT", "FTRAIN_ATTEMPT")
with (state / "env.jsonl").open("a") as f:
    f.write(json.dumps({k: os.environ.get(k) for k in keys}) + "\\n")
run, ckpt_dir = os.environ["FTRAIN_RUN_ID"], Path(os.environ["FTRAIN_CKPT_DIR"])


def ftrain(*args):
    done = subprocess.run([str(Path(sys.executable).with_name("ftrain")), *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"trainer: ftrain {' '.join(args)} failed: {done.stderr}")


def terminated(signum, frame):
    from ftrain.settings import stop_note
    from ftrain.train.preemption import stop_name
    (state / "terminated").write_text(stop_name(signal.Signals(signum), stop_note()))
    sys.exit(0)


for action in plans[start - 1].split("+"):
    if action == "ckpt":
        ftrain("checkpoint", run, "--step", str(start * 10), "--epoch", "0", "--shards", "1", "--state", "{}")
        assert (ckpt_dir / f"step-{start * 10}" / ".complete").exists(), "FTRAIN_CKPT_DIR is not the run's"
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "wait":
        signal.signal(signal.SIGTERM, terminated)
        signal.signal(signal.SIGUSR1, terminated)  # the warning the relay hands the workers for a SIGTERM
        (state / "started").touch()
        time.sleep(60)
    elif action.startswith("exit"):
        sys.exit(int(action[4:]))
'''


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return Cli(capsys, env)


@pytest.fixture
def trainer(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-in trainer script and its (empty) state directory."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    state = tmp_path / "trainer-state"
    state.mkdir()
    return script, state


def starts(state: Path) -> list[dict[str, str | None]]:
    path = state / "env.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
