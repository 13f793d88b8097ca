"""A final save: the run's last checkpoint is its end state, written once (issue 34)."""

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ftrain.train.checkpointing import CheckpointManager
from ftrain.workers.layout import complete_steps


def _run(ckpt: Path, stage: Path, total: int, every: int, async_save: bool) -> tuple[int, list[int]]:
    """The documented loop to `total` steps: the step it resumed from, and the steps its saver wrote."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = CheckpointManager(
        ckpt, model=model, optimizer=optimizer, every=every, async_save=async_save, stage_dir=stage, keep=10
    )
    saved: list[int] = []
    write = manager._saver.save

    def counted(step: int, *args: Any, **kwargs: Any) -> bool:
        saved.append(step)
        return write(step, *args, **kwargs)

    manager._saver.save = counted  # type: ignore[method-assign]
    step = start = manager.load()
    try:
        while step < total:
            model(torch.ones(4)).sum().backward()
            optimizer.step()
            step += 1
            if manager.due(step):
                manager.save(step)
        manager.save(step, final=True)
        assert complete_steps(ckpt)[0] == step  # sealed before it returned, async too
    finally:
        manager.close()
    return start, saved


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_final_save_seals_the_last_step_once(tmp_path: Path, async_save: bool) -> None:
    ckpt, stage = tmp_path / "ckpt" / "run", tmp_path / "stage"

    assert _run(ckpt, stage, 12, 5, async_save) == (0, [5, 10, 12])
    marker = ckpt / "step-12"
    written = {p.name: p.stat().st_mtime_ns for p in marker.iterdir()}

    assert _run(ckpt, stage, 12, 5, async_save) == (12, [])  # resumed at the end: nothing written again
    assert {p.name: p.stat().st_mtime_ns for p in marker.iterdir()} == written
    assert _run(ckpt, stage, 15, 5, async_save) == (12, [15])  # the last step was just saved: once
    assert complete_steps(ckpt) == [15, 12, 10, 5]
