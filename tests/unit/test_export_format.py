"""The safetensors layout `ftrain export` streams (header from shapes alone, shards cut as Hugging Face cuts
them, sizes as it writes them), read back by the safetensors library itself; the export directory left
absent when writing fails; the checkpoint chosen from the log (the command itself:
tests/integration/test_export.py)."""

from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from ftrain.errors import NotFound, Refused
from ftrain.export import safetensors_format as st
from ftrain.export.export import pick
from ftrain.export.target import staged
from tests.support.builders import checkpointed, fold, launched


def test_a_streamed_file_reads_back_through_the_safetensors_library(tmp_path: Path) -> None:
    values = {
        "embed.weight": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
        "scale": torch.tensor(2.5, dtype=torch.float64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 5),
        "ids": torch.arange(5, dtype=torch.int64),
    }
    tensors = [
        st.Tensor(
            name, st.DTYPES[str(t.dtype).removeprefix("torch.")], tuple(t.shape), t.numel() * t.element_size()
        )
        for name, t in values.items()
    ]
    path = tmp_path / "model.safetensors"
    with path.open("wb") as f:
        head = st.header(tensors)
        assert (len(head) - 8) % 8 == 0  # the data starts aligned
        f.write(head)
        for t in values.values():
            f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    loaded = load_file(path)
    assert loaded.keys() == values.keys()
    assert all(torch.equal(loaded[n], t) and loaded[n].dtype == t.dtype for n, t in values.items())


def _t(name: str, nbytes: int) -> st.Tensor:
    return st.Tensor(name, "U8", (nbytes,), nbytes)


def test_shards_are_cut_as_hugging_face_cuts_them() -> None:
    cut = st.shards([_t("a", 4), _t("b", 4), _t("c", 3), _t("big", 20), _t("d", 1)], 10)
    assert [[t.name for t in shard] for shard in cut] == [["a", "b"], ["c"], ["big"], ["d"]]
    assert st.shard_names(1) == ["model.safetensors"]
    assert st.shard_names(3)[1] == "model-00002-of-00003.safetensors"
    index = st.index(cut, st.shard_names(len(cut)))
    assert b'"total_size": 32' in index and b'"big": "model-00003-of-00004.safetensors"' in index


@pytest.mark.parametrize(
    ("text", "size"), [("5GB", 5 * 10**9), ("500MiB", 500 * 2**20), ("1000", 1000), ("1.5kb", 1500)]
)
def test_sizes_are_read_as_hugging_face_writes_them(text: str, size: int) -> None:
    assert st.parse_size(text) == size


@pytest.mark.parametrize("text", ["big", "0", "-1GB", "5 PB", ""])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"size|at least one byte"):
        st.parse_size(text)


def test_a_failed_export_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "w"

    def fail() -> None:
        with staged(target) as out:
            (out / "model.safetensors").write_bytes(b"partial")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fail()
    assert list(tmp_path.iterdir()) == []
    with staged(target) as out:
        (out / "model.safetensors").write_bytes(b"whole")
    assert [p.name for p in tmp_path.iterdir()] == ["w"]
    assert (target / "model.safetensors").read_bytes() == b"whole"
    assert target.stat().st_mode & 0o777 == 0o700


def test_the_checkpoint_exported_is_one_the_log_holds_valid() -> None:
    run = "r-export"
    state = fold(launched(run), checkpointed(run, 10), checkpointed(run, 20), checkpointed(run, 30))
    assert pick(state, None).step == 30
    assert pick(state, 10).step == 10
    corrupt = [r if r.step != 30 else msgspec.structs.replace(r, status="corrupt", reason="file x hash mismatch")
               for r in state.checkpoints]  # fmt: skip
    pruned = [r if r.step != 10 else msgspec.structs.replace(r, status="pruned") for r in corrupt]
    state = msgspec.structs.replace(state, checkpoints=tuple(pruned))
    assert pick(state, None).step == 20  # the newest the log still holds valid
    with pytest.raises(Refused, match=r"step 30 was found corrupt \(file x hash mismatch\)"):
        pick(state, 30)
    with pytest.raises(Refused, match="step 10 was deleted by retention"):
        pick(state, 10)
    with pytest.raises(NotFound, match=r"no checkpoint at step 5 \(valid steps: 20\)"):
        pick(state, 5)
    with pytest.raises(NotFound, match="no valid checkpoint"):
        pick(fold(launched(run)), None)
