"""What a training loop keeps in its `states` saves and resumes, in one process with its private gloo group:
the values loops keep (NumPy scalars and arrays, `datetime`'s types, `Fraction`, `Decimal`, `deque`) are
written by DCP and loaded back through the allowlisted reader, on the sync and the async path; a type the
allowlist does not know is refused at the save, before anything of the step is written or, in a logged run,
recorded; `allow_pickled` lets it in (the allowlist's own cases: tests/unit/test_unpickle.py)."""

import asyncio
import collections
import datetime
import decimal
import fractions
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ftrain.events.schema import Checkpointed
from ftrain.service import RunService
from ftrain.train.checkpointing import CheckpointManager, UnresumableState, allow_pickled
from tests.support.runs import launch, stored

UTC_PLUS_2 = datetime.timezone(datetime.timedelta(hours=2), "CEST")
KEPT: dict[str, Any] = {
    **{f"numpy_{code}": np.dtype(code).type(1) for code in np.typecodes["AllInteger"]},
    **{f"numpy_{code}": np.dtype(code).type(0.5) for code in np.typecodes["AllFloat"]},
    "numpy_bool": np.bool_(True),
    "numpy_datetime64": np.datetime64("2026-12-04T16:30"),
    "numpy_timedelta64": np.timedelta64(90, "s"),
    "numpy_array": np.arange(6, dtype=np.float32).reshape(2, 3),
    "datetime": datetime.datetime(2026, 12, 4, 16, 30, 1, 5, tzinfo=UTC_PLUS_2),
    "date": datetime.date(2026, 12, 4),
    "time": datetime.time(16, 30, tzinfo=datetime.UTC),
    "timedelta": datetime.timedelta(days=2, seconds=7, microseconds=3),
    "timezone": UTC_PLUS_2,
    "fraction": fractions.Fraction(-22, 7),
    "decimal": decimal.Decimal("0.1000"),
    "deque": collections.deque([0.5, 0.25], maxlen=100),
}
"""What a training loop keeps between steps (a best loss, a start time, recent losses), by name."""


class Unknown:
    """A script's own value type, never allowed."""

    def __init__(self, value: float) -> None:
        self.value = value


class Allowed:
    """A script's own value type, allowed by the script."""

    def __init__(self, value: float) -> None:
        self.value = value


class Tracker:
    """A named state whose state_dict() holds whatever it is given."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def state_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.values = dict(state)


@pytest.fixture(autouse=True)
def outside_ftrain_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    for name in ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_CHECKPOINT_EVERY", "FTRAIN_DATASET_REVISION"):
        monkeypatch.delenv(name, raising=False)
    yield
    assert not torch.distributed.is_initialized(), "the manager left its private process group behind"


def _manager(
    location: Path, tracker: Tracker, async_save: bool = False, run_id: str | None = None
) -> CheckpointManager:
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return CheckpointManager(
        location,
        model=model,
        optimizer=optimizer,
        states={"tracker": tracker},
        async_save=async_save,
        run_id=run_id,
    )


def _saved(location: Path, values: dict[str, Any], async_save: bool = False) -> None:
    ckpt = _manager(location, Tracker(values), async_save)
    try:
        assert ckpt.load() == 0
        ckpt.save(5)
    finally:
        ckpt.close()


def _resumed(location: Path, template: dict[str, Any]) -> dict[str, Any]:
    """What a new job resumes `tracker` as, its state_dict() shaped like `template` before the load."""
    tracker = Tracker(template)
    ckpt = _manager(location, tracker)
    try:
        assert ckpt.load() == 5
    finally:
        ckpt.close()
    return tracker.values


@pytest.mark.parametrize("async_save", [False, True])
def test_the_values_training_loops_keep_save_and_resume_with_their_types(
    tmp_path: Path, async_save: bool
) -> None:
    _saved(tmp_path / "ckpt", KEPT, async_save)
    resumed = _resumed(tmp_path / "ckpt", dict.fromkeys(KEPT))
    # the types pickle itself gives back (numpy unpickles a longlong as the int64 it equals)
    assert {k: type(v) for k, v in resumed.items()} == {
        k: type(pickle.loads(pickle.dumps(v))) for k, v in KEPT.items()
    }
    assert np.array_equal(resumed.pop("numpy_array"), KEPT["numpy_array"])
    assert resumed == {k: v for k, v in KEPT.items() if k != "numpy_array"}
    assert resumed["deque"].maxlen == 100


def _refused(
    location: Path, values: dict[str, Any], async_save: bool = False, run_id: str | None = None
) -> str:
    """The one line a save of `values` at step 10 is refused with, after a save of plain values at step 5
    (the refused value appears later, as a best loss does): nothing of step 10 was written."""
    tracker = Tracker({})
    ckpt = _manager(location, tracker, async_save, run_id)
    try:
        ckpt.load()
        ckpt.save(5)
        tracker.values = values
        with pytest.raises(UnresumableState) as refused:
            ckpt.save(10)
    finally:
        ckpt.close()
    assert sorted(p.name for p in location.glob("*step-*")) == ["step-5"]  # step 10 neither sealed nor begun
    return str(refused.value)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_type_a_resume_would_refuse_is_refused_at_the_save_and_nothing_is_written(
    tmp_path: Path, async_save: bool
) -> None:
    name = f"{__name__}.Unknown"
    assert _refused(tmp_path / "ckpt", {"best": {"record": Unknown(0.5)}}, async_save) == (
        f"checkpoint at step 10 not saved: state item tracker['best']['record'] (a {name}) names {name}, "
        "which is not allowed, so no resume could load it: keep plain values in state_dict() (tensors, "
        "numbers, strings, containers, NumPy numbers and arrays, datetimes), or allow the type before the "
        f"first save with ftrain.train.checkpointing.allow_pickled({name}) if loading it runs no code"
    )


def test_a_value_that_cannot_be_pickled_is_refused_at_the_save(tmp_path: Path) -> None:
    assert _refused(tmp_path / "ckpt", {"hook": lambda: None}).startswith(
        "checkpoint at step 10 not saved: state item tracker['hook'] (a function) cannot be pickled: "
    )


async def test_in_a_logged_run_a_refused_save_records_nothing(app: RunService, env: dict[str, str]) -> None:
    await launch(app, "r1")
    location = Path(env["FTRAIN_STORAGE"]) / "r1"
    refused = await asyncio.to_thread(_refused, location, {"best": Unknown(0.5)}, run_id="r1")
    assert refused.startswith("checkpoint at step 10 not saved: state item tracker['best'] ")
    assert [e.step for _, e, _ in await stored(app, "r1") if isinstance(e, Checkpointed)] == [5]


def test_a_type_the_script_allows_saves_and_resumes(tmp_path: Path) -> None:
    allow_pickled(Allowed)
    _saved(tmp_path / "ckpt", {"best": Allowed(0.5)})
    assert _resumed(tmp_path / "ckpt", {"best": None})["best"].value == 0.5
