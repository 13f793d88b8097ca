"""Checkpoint pickles load only through the allowlist: a hostile global is refused by name and never runs;
what real checkpoints hold (DCP metadata, tensors, RNG states old and new, the values training loops keep)
still loads; and a save names the state item a resume would refuse, before anything is written."""

import collections
import datetime
import decimal
import enum
import fractions
import io
import os
import pickle
import pickletools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ftrain.train.save_check import PLAIN_DEPTH, plain, refusal
from ftrain.train.state import rng_state, set_rng_state
from ftrain.workers.dcp_reader import load_metadata
from ftrain.workers.unpickle import ForbiddenPickle, allow_pickled, restricted_loads, torch_load
from tests.support.builders import write_checkpoint


class Touch:
    """A pickle whose loading would create a file: the attack, made harmless to detect."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


class Custom:
    """A training script's own state type."""

    def __init__(self, value: int) -> None:
        self.value = value


class Unlisted:
    """A training script's own state type it never allows."""

    def __init__(self, value: int) -> None:
        self.value = value


KEPT = [
    *(np.dtype(code).type(1) for code in np.typecodes["AllInteger"] + np.typecodes["AllFloat"] + "?"),
    np.datetime64("2026-12-04T16:30:00.5"),
    np.timedelta64(-7, "D"),
    np.arange(6, dtype=np.float16).reshape(2, 3),
    datetime.datetime(
        2026, 12, 4, 16, 30, 1, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=-5), "EST")
    ),
    datetime.date(1, 1, 1),
    datetime.time(23, 59, 59, 999999, tzinfo=datetime.UTC),
    datetime.timedelta(days=-999999999),
    datetime.UTC,
    fractions.Fraction(-(10**40), 3),
    decimal.Decimal("-0.000"),
    decimal.Decimal("1E+999999999"),  # its exponent, not a billion digits
    decimal.Decimal("NaN"),
    collections.deque([0.5, "x", None], maxlen=3),
]
"""The values training loops keep in a state dict (a best loss, when the run started, recent losses)."""


@pytest.mark.parametrize("value", KEPT, ids=lambda value: type(value).__name__)
def test_the_values_training_loops_keep_load_as_dcp_stores_them(value: Any) -> None:
    """DCP writes a non-tensor item as `torch.save` bytes; older RNG states were `pickle.dumps`'s."""
    buffer = io.BytesIO()
    torch.save({"v": value}, buffer)
    buffer.seek(0)
    assert repr(torch_load(buffer, "item")["v"]) == repr(value)
    assert repr(restricted_loads(pickle.dumps(value, protocol=4), "item")) == repr(value)


def test_a_state_item_a_resume_would_refuse_is_named_by_its_path_and_type() -> None:
    name = f"{__name__}.Unlisted"
    assert refusal({"model": {"w": torch.zeros(2)}, "best": {"loss": np.float64(0.5)}}) is None
    assert refusal({"best": {"loss": np.float64(0.5), "seen": [Unlisted(1)]}}) == (
        f"state item best['seen'] (a list) names {name}, which is not allowed, so no resume could load it: "
        "keep plain values in state_dict() (tensors, numbers, strings, containers, NumPy numbers and arrays, "
        "datetimes), or allow the type before the first save with "
        f"ftrain.train.checkpointing.allow_pickled({name}) if loading it runs no code"
    )
    assert refusal({"stats": {"split": np.str_("train")}}) == (
        "state item stats['split'] (a numpy.str_) does not unpickle: ValueError: a numpy scalar loads as a "
        "number (bool, integer, float, complex, datetime64, timedelta64) from exactly its dtype's bytes, so "
        "no resume could load it"
    )


PLAIN = [
    0,
    -(2**100),
    0.5,
    float("nan"),
    True,
    None,
    "a \udc80 lone surrogate",
    (1, 2.0, "x", None),
    [1, [2, {"lr": 3e-4, 4: (5,)}]],
    {"step": 7, "betas": (0.9, 0.999), "params": list(range(625))},
]
"""What the save check passes without the round trip: plain data."""


@pytest.mark.parametrize("value", PLAIN, ids=lambda value: type(value).__name__)
def test_plain_data_skips_the_round_trip_because_its_pickle_names_no_global(value: Any) -> None:
    assert plain(value)
    opcodes = {op.name for op, _, _ in pickletools.genops(pickle.dumps(value, protocol=2))}
    assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX"}
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    assert repr(torch_load(buffer, "item")) == repr(value)


class Level(enum.IntEnum):
    HIGH = 1


def test_subclasses_bytes_and_deep_or_cyclic_containers_are_not_plain_and_take_the_round_trip() -> None:
    """A NumPy float is a float and an IntEnum an int, but their pickles name their classes; protocol 2
    writes bytes through `_codecs.encode`. Each goes through the unpickler, which decides."""
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    deep: Any = 1
    for _ in range(PLAIN_DEPTH + 1):
        deep = [deep]
    for value in (np.float64(0.5), Level.HIGH, b"raw", [1, np.int64(2)], {"k": Unlisted(1)}, cyclic, deep):
        assert not plain(value)
    assert refusal({"best": {"deep": deep, "loss": np.float64(0.5)}}) is None  # DCP cannot flatten a cycle
    assert refusal({"best": {"level": Level.HIGH}}) == (
        f"state item best['level'] (a {__name__}.Level) names {__name__}.Level, which is not allowed, so no "
        "resume could load it: keep plain values in state_dict() (tensors, numbers, strings, containers, NumPy "
        "numbers and arrays, datetimes), or allow the type before the first save with "
        f"ftrain.train.checkpointing.allow_pickled({__name__}.Level) if loading it runs no code"
    )


def test_a_pickle_naming_a_global_outside_the_allowlist_is_refused_by_name_and_never_runs(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "MARKER"
    with pytest.raises(ForbiddenPickle, match=r"^RNG state names posix\.system, which is not allowed$"):
        restricted_loads(pickle.dumps(Touch(marker)), "RNG state")
    buffer = io.BytesIO()
    torch.save({"lr": 0.1, "hook": Touch(marker)}, buffer)
    buffer.seek(0)
    with pytest.raises(ForbiddenPickle, match=r"^item app\.x names posix\.system, which is not allowed$"):
        torch_load(buffer, "item app.x")
    legacy = (
        io.BytesIO()
    )  # torch.load's other path: the pre-zip format reads its header with the module's load
    torch.save({"hook": Touch(marker)}, legacy, _use_new_zipfile_serialization=False)
    legacy.seek(0)
    with pytest.raises(ForbiddenPickle, match=r"names posix\.system, which is not allowed$"):
        torch_load(legacy, "item app.y")
    assert not marker.exists()


def test_tensors_containers_and_registered_types_load(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    value = {"t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "s": {1, 2}, "b": b"\x00\xff"}
    torch.save(value, buffer)
    buffer.seek(0)
    loaded = torch_load(buffer, "item")
    assert torch.equal(loaded["t"], value["t"]) and (loaded["s"], loaded["b"]) == (value["s"], value["b"])

    with pytest.raises(
        ForbiddenPickle, match=r"names tests\.unit\.test_unpickle\.Custom, which is not allowed"
    ):
        restricted_loads(pickle.dumps(Custom(3)), "item")
    allow_pickled(Custom)
    assert restricted_loads(pickle.dumps(Custom(3)), "item").value == 3


def test_rng_state_is_plain_numbers_and_an_old_pickled_state_still_restores() -> None:
    random.seed(1)
    np.random.seed(2)
    new = rng_state()
    old = {**new, "python": pickle.dumps(random.getstate()), "numpy": pickle.dumps(np.random.get_state())}
    expected = (random.random(), np.random.rand())

    for state in (new, old):
        random.seed(99)
        np.random.seed(99)
        set_rng_state(state)
        assert (random.random(), np.random.rand()) == expected
    assert not any(isinstance(v, bytes) for v in new.values())


def test_a_malicious_metadata_with_a_matching_manifest_is_refused_naming_the_global(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    written = write_checkpoint(
        tmp_path / "storage",
        run_id="r",
        step=10,
        epoch=0,
        shards=1,
        sources=[(".metadata", pickle.dumps(Touch(marker))), ("__0_0.distcp", b"")],
    )
    reason = load_metadata(written.path, written.manifest.files)
    assert reason == "`.metadata` names posix.system, which is not allowed"
    assert not marker.exists()

    swapped = pickle.dumps({"not": "metadata"})  # after every rank verified it: the bytes parsed are checked
    size = (written.path / ".metadata").stat().st_size
    (written.path / ".metadata").write_bytes(swapped)
    assert load_metadata(written.path, written.manifest.files) == (
        f"file .metadata is {len(swapped)} bytes, manifest says {size}"
    )
