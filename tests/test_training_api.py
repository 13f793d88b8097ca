"""The public training API as a user's script meets it: named states, configuration checked where it is made,
one process or many, the supervisor's settings, and the examples resumed bit-identically under `ftrain run`."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ftrain.train.checkpointing import CheckpointManager, make_config
from ftrain.train.preemption import PREEMPTED_EXIT
from ftrain.train.state import TrainState
from ftrain.workers.manifest import decode_manifest
from tests.conftest import free_port, ftrain_process

REPO = Path(__file__).resolve().parent.parent
FINAL = "FINAL step="


# -- configuration, checked where it is made ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep": 1}, "keep=1: at least 2 checkpoints must be kept"),
        ({"keep": 0}, "keep=0: at least 2 checkpoints must be kept"),
        ({"every": "often"}, "every: --checkpoint-every 'often'"),
        ({"every": 0}, "save_interval=0"),
        ({"every": 2.5}, "every=2.5: a step count"),
        ({"run_id": "no spaces allowed"}, "run_id"),
    ],
)
def test_a_bad_argument_is_a_value_error_naming_it(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        make_config(tmp_path / "run", env={}, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("location", "message"),
    [
        (None, "location: required outside `ftrain run`"),
        ("gs://bucket/run", "location: storage 'gs://bucket/run': scheme 'gs' is not supported"),
        ("s3://bucket", "location: checkpoint location 's3://bucket': name the run's own"),
        ("s3://b/run", "location: storage 's3://b/run': expected s3://bucket"),
    ],
)
def test_a_location_is_parsed_once_and_never_becomes_a_silent_local_path(
    location: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        make_config(location, env={})


def test_an_s3_location_is_object_storage_and_async_saves_get_a_private_stage_dir(tmp_path: Path) -> None:
    config = make_config("s3://ftrain/exp/my-run", async_save=True, env={})
    assert (config.location.backend, config.location.root, config.location.run) == (
        "s3",
        "s3://ftrain/exp",
        "my-run",
    )
    assert config.stage_dir.name == "my-run" and config.stage_dir.parent.name == f"ftrain-{os.getuid()}"
    local = make_config(tmp_path / "run", env={"SLURM_JOB_ID": "4242"})
    assert local.location.path == tmp_path / "run" and local.stage_dir.name == "4242"


def test_under_ftrain_run_the_supervisors_run_location_cadence_and_revision_win(tmp_path: Path) -> None:
    env = {
        "FTRAIN_RUN_ID": "sup-1",
        "FTRAIN_CKPT_DIR": str(tmp_path / "sup-1"),
        "FTRAIN_CHECKPOINT_EVERY": "25steps",
        "FTRAIN_DATASET_REVISION": "A1-rev",
    }
    config = make_config(tmp_path / "mine", every=10, dataset_revision="mine", run_id="mine", env=env)
    assert (config.run_id, config.location.path, config.save_interval, config.dataset_revision) == (
        "sup-1", tmp_path / "sup-1", 25, "A1-rev",
    )  # fmt: skip
    timed = make_config(None, env={**env, "FTRAIN_CHECKPOINT_EVERY": "1h"})
    assert (timed.save_interval, timed.every_seconds) == (None, 3600.0)


def test_named_states_must_be_stateful_and_keep_clear_of_ftrains_keys() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"^states\['progress'\]: the name is ftrain's own"):
        TrainState(model, None, {"progress": model}, 0)
    with pytest.raises(ValueError, match=r"^states\['counter'\]: a int has no state_dict"):
        TrainState(model, None, {"counter": 3}, 0)  # type: ignore[dict-item]


# -- one process, in this one ------------------------------------------------------------------------------


class Counter:
    """An extra piece of training state of the user's own."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def _train(location: Path, steps: int, stop_at: int | None = None) -> tuple[int, list[torch.Tensor], int]:
    """A single-process loop with no process group of its own; returns the step reached, the weights, and
    the counter's value."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    counter = Counter()
    loader = torch.utils.data.DataLoader(list(range(8)))  # no saved position: accepted, with a warning
    ckpt = CheckpointManager(
        location, model=model, optimizer=optimizer, states={"counter": counter}, loader=loader, every=5
    )
    try:
        step = ckpt.load()
        while step < (stop_at or steps):
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            counter.seen += 1
            step += 1
            if ckpt.due(step):
                ckpt.save(step)
    finally:
        ckpt.close()
    return step, [p.detach().clone() for p in model.parameters()], counter.seen


@pytest.fixture
def no_group() -> Iterator[None]:
    assert not torch.distributed.is_initialized()
    yield
    assert not torch.distributed.is_initialized(), "the manager left its private process group behind"


@pytest.mark.usefixtures("no_group")
def test_a_single_process_script_resumes_with_its_own_states_and_a_plain_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    for name in ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_CHECKPOINT_EVERY", "FTRAIN_DATASET_REVISION"):
        monkeypatch.delenv(name, raising=False)
    whole = _train(tmp_path / "whole", 12)
    assert _train(tmp_path / "cut", 12, stop_at=10)[0] == 10
    step, weights, seen = _train(tmp_path / "cut", 12)  # resumes from step 10
    assert (step, seen) == (12, 12) == (whole[0], whole[2])
    assert all(torch.equal(a, b) for a, b in zip(weights, whole[1], strict=True))
    manifest = decode_manifest((tmp_path / "cut" / "step-10" / "manifest.json").read_bytes())
    assert (manifest.run_id, manifest.world_size) == ("cut", 1)


# -- imports and names -------------------------------------------------------------------------------------


def test_a_users_events_workers_and_projections_modules_beside_the_script_break_nothing(
    tmp_path: Path,
) -> None:
    for name in ("events", "workers", "projections"):
        (tmp_path / f"{name}.py").write_text(f"MINE = {name!r}\n")
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import events, workers, projections
            from ftrain.train.checkpointing import CheckpointManager
            import ftrain.events.schema
            assert (events.MINE, workers.MINE, projections.MINE) == ("events", "workers", "projections")
            print("ok", CheckpointManager.__name__)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok CheckpointManager\n", "")


# -- end to end: the examples under torchrun and `ftrain run` ----------------------------------------------


def _job_env(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    for name in ("FTRAIN_KILL_AT", "FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_ATTEMPT"):
        env.pop(name, None)
    env.update(extra or {})
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


def _torchrun(module: str, *args: str, nproc: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", module, *args,
    ]  # fmt: skip


def _final(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(FINAL)]
    assert lines, out[-3000:]
    return lines[-1].rpartition("params_sha256=")[2]


EXAMPLES = [("ftrain.examples.ddp", 2), ("ftrain.examples.single_process", 1)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each example's final digest, trained in one go."""
    digests = {}
    for module, nproc in EXAMPLES:
        tmp = tmp_path_factory.mktemp(module.rpartition(".")[2])
        command = (
            _torchrun(module, "--location", str(tmp / "run"), nproc=nproc)
            if nproc > 1
            else [sys.executable, "-m", module, "--location", str(tmp / "run")]
        )
        result = subprocess.run(
            command, env=_job_env(tmp), capture_output=True, text=True, timeout=180, check=False
        )
        assert result.returncode == 0, result.stderr[-3000:]
        digests[module] = _final(result.stdout)
    return digests


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize(("module", "nproc"), EXAMPLES)
def test_each_example_killed_under_ftrain_run_resumes_to_the_uninterrupted_digest_with_goodput_known(
    tmp_path: Path, env: dict[str, str], uninterrupted: dict[str, str], module: str, nproc: int
) -> None:
    run_id = f"api-{module.rpartition('.')[2].replace('_', '-')}"
    kill_once = tmp_path / "kill-once"
    kill_once.mkdir()
    job = _job_env(tmp_path, {**env, "FTRAIN_KILL_AT": "step:25", "FTRAIN_KILL_ONCE": str(kill_once)})
    result = ftrain_process(
        ["run", "api", "--nodes", "1", "--gpus-per-node", str(nproc), "--run-id", run_id,
         "--backoff", "0", "--checkpoint-every", "10steps", "--dataset-revision", "A1-rev",
         "--", "python", "-m", module],
        job, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert _final(result.stdout) == uninterrupted[module]
    assert "RESUMED from step=20" in result.stdout
    storage = Path(env.get("FTRAIN_STORAGE") or Path(env["FTRAIN_HOME"]) / "checkpoints")
    manifest = decode_manifest((storage / run_id / "step-60" / "manifest.json").read_bytes())
    assert manifest.dataset_revision == "A1-rev"  # the launch's, passed to the trainer by the supervisor
    cost = ftrain_process(["cost", "--run", run_id, "--json"], env)
    assert cost.returncode == 0, cost.stderr
    goodput = json.loads(cost.stdout)["goodput"]
    assert goodput["unknown"] == [], goodput
    assert goodput["lost_steps"] == 5  # reached 25, resumed from 20


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_save", [False, True])
def test_a_warning_signal_saves_the_next_step_on_every_rank_and_exits_83_then_nothing_is_lost(
    tmp_path: Path, async_save: bool
) -> None:
    from tests.training import FINAL as TRAINER_FINAL
    from tests.training import RESUMED, torchrun_command

    ckpt = tmp_path / "run"
    flags = ("--train-iters", "400", "--save-interval", "1000", *(("--async-ckpt",) if async_save else ()))
    job = _job_env(tmp_path, {"FTRAIN_STEP_DELAY": "0.05"})
    child = subprocess.Popen(
        torchrun_command(ckpt, *flags), env=job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    metrics = ckpt / "metrics" / "metrics-0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not metrics.exists() or len(metrics.read_bytes().splitlines()) < 5
    ):
        time.sleep(0.2)  # training, its handlers installed
    workers = _workers_of(child.pid)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGUSR1)  # as Slurm's --signal=USR1 delivers it: to every task
    out, err = child.communicate(timeout=120)
    assert child.returncode != 0 and f"exitcode  : {PREEMPTED_EXIT}" in err, err[-3000:]
    assert "FINAL" not in out
    saved = sorted(int(p.name.removeprefix("step-")) for p in ckpt.glob("step-*"))
    assert len(saved) == 1 and 0 < saved[0] < 400, (saved, err[-3000:])
    assert "PREEMPTED by SIGUSR1: checkpoint at step" in err
    again = subprocess.run(
        torchrun_command(ckpt, *flags), env={**job, "FTRAIN_STEP_DELAY": ""}, capture_output=True, text=True,
        timeout=180, check=False,
    )  # fmt: skip
    match = RESUMED.search(again.stdout)
    assert again.returncode == 0 and match and int(match.group(1)) == saved[0], again.stderr[-3000:]
    assert TRAINER_FINAL.search(again.stdout)


def _workers_of(agent: int) -> list[int]:
    """The trainer processes torchrun `agent` started (its children running ftrain.examples.train)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent == agent and b"ftrain.examples.train" in cmdline:
            found.append(int(entry.name))
    return found


def test_the_readme_snippet_is_the_plain_ddp_example_verbatim() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.partition("## Your own training script")[2].partition("\n## ")[0]
    block = section.partition("```python\n")[2].partition("```")[0]
    assert block.strip(), "the README's own-script section has no python block"
    example = (REPO / "ftrain" / "examples" / "ddp.py").read_text()
    body = textwrap.dedent(block)
    assert textwrap.indent(body, "    ") in example or body in example, "the README's snippet is not ddp.py's"
    assert len(body.strip().splitlines()) <= 20
