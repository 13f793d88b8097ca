"""The public training API in one process: a single-process script resumes with its own states and a plain
loader, and a user's `events`, `workers` and `projections` modules beside the script break nothing (its
configuration: tests/unit/test_training_config.py; the examples under torchrun and `ftrain run`:
tests/e2e/test_training_api.py)."""

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.sampler import GlobalSampler
from ftrain.workers.manifest import decode_manifest
from tests.support.cli import RUN, Cli, launch

# -- one process, in this one ----------------------------------------------------------------------------


class Counter:
    """An extra piece of training state of the user's own."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def _train(
    location: Path | str, steps: int, stop_at: int | None = None, **manager: object
) -> tuple[int, list[torch.Tensor], int]:
    """A single-process loop with no process group of its own (`manager`: more of the manager's arguments);
    returns the step reached, the weights, and the counter's value."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    counter = Counter()
    loader = torch.utils.data.DataLoader(list(range(8)))  # no saved position: accepted, with a warning
    ckpt = CheckpointManager(
        location,
        model=model,
        optimizer=optimizer,
        states={"counter": counter},
        loader=loader,
        every=5,
        **manager,  # type: ignore[arg-type]
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


@pytest.mark.usefixtures("no_group")
def test_a_trainer_on_a_logged_run_names_what_retention_retires_and_status_shows_it_pruned(cli: Cli) -> None:
    """The trainer with a run id, against the log: each `checkpointed` names the steps retention deletes
    with it, the projection shows those `pruned`, and the newest two (keep=2) stay, on disk and `valid`; a
    resumed job counts the steps the log vouched for at its start."""
    launch(cli)
    for start, steps in ((0, (1, 2, 3, 4)), (4, (5,))):  # then a resume: the log's steps 4 and 3 count
        ckpt = CheckpointManager(cli.storage() / RUN, model=nn.Linear(4, 1), run_id=RUN, keep=2, every=1)
        try:
            assert ckpt.load() == start
            for step in steps:
                ckpt.save(step)
        finally:
            ckpt.close()
    assert sorted(p.name for p in (cli.storage() / RUN).glob("step-*")) == ["step-4", "step-5"]
    status = json.loads(cli.ok("status", RUN, "--json")[0])
    assert [(c["step"], c["status"]) for c in status["checkpoints"]] == [
        (1, "pruned"),
        (2, "pruned"),
        (3, "pruned"),
        (4, "valid"),
        (5, "valid"),
    ]


@pytest.mark.usefixtures("no_group")
def test_a_final_save_is_the_runs_last_checkpoint_in_status(cli: Cli) -> None:
    """A 12-step loop with every=5 ends with `save(12, final=True)`: `status` shows step 12 as the newest
    valid checkpoint (it showed 10: the end state was never saved)."""
    launch(cli)
    ckpt = CheckpointManager(cli.storage() / RUN, model=nn.Linear(4, 1), run_id=RUN, keep=5, every=5)
    try:
        step = ckpt.load()
        while step < 12:
            step += 1
            if ckpt.due(step):
                ckpt.save(step)
        ckpt.save(step, final=True)
    finally:
        ckpt.close()
    status = json.loads(cli.ok("status", RUN, "--json")[0])
    assert status["step"] == 12
    assert [(c["step"], c["status"]) for c in status["checkpoints"]] == [
        (5, "valid"),
        (10, "valid"),
        (12, "valid"),
    ]


def test_the_log_records_the_data_position_of_each_checkpoint_and_of_the_resume(cli: Cli) -> None:
    """A loader over a GlobalSampler: every `checkpointed` carries the position of the state it sealed, the
    trainer's `resumed` the world that saved it, the world that resumed it and the position, and `status`
    shows the newest valid checkpoint's."""
    launch(cli)
    for start, steps in ((0, (1, 2, 3)), (3, (4,))):
        sampler = GlobalSampler(64, 16, seed=5)
        loader = torch.utils.data.DataLoader(list(range(64)), batch_sampler=sampler)
        ckpt = CheckpointManager(
            cli.storage() / RUN, model=nn.Linear(4, 1), loader=loader, run_id=RUN, every=1
        )
        try:
            assert ckpt.load() == start
            for step in steps:
                if ckpt.due(step):
                    ckpt.save(step)
        finally:
            ckpt.close()
    seen = [entry["event"] for entry in json.loads("\n".join(cli.ok("replay", RUN, "--json")))]
    sealed = {e["step"]: e["data"] for e in seen if e["type"] == "checkpointed"}
    assert sealed[3] == {"epoch": 0, "offset": 48, "consumed": 48, "seed": 5}
    assert sealed[4] == {"epoch": 1, "offset": 0, "consumed": 64, "seed": 5}  # 4 global batches an epoch
    resumed = next(e for e in seen if e["type"] == "resumed")
    assert (resumed["saved_world"], resumed["world"], resumed["data"]) == (1, 1, sealed[3])
    status = cli.ok("status", RUN)
    assert (
        "data        epoch 1, 0 samples into it, 64 trained in all (seed 5); saved by 1 rank, resumable on "
        "any number" in status
    ), status
