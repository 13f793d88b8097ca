"""Checkpoint pickles load only through the allowlist: a hostile global is refused by name and never runs;
what real checkpoints hold (DCP metadata, tensors, RNG states old and new) still loads."""

import io
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ftrain.train.state import rng_state, set_rng_state
from ftrain.workers.checkpoint_dir import write_checkpoint
from ftrain.workers.dcp_reader import load_metadata
from ftrain.workers.unpickle import ForbiddenPickle, allow_pickled, restricted_loads, torch_load


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
