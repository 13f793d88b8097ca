"""Parts of a snapshot, each written alone by DCP (`no_dist`), read as one checkpoint (`merged_metadata`): a
tensor both parts hold comes from the first, a tensor of one part's only from it, every other item from
the first part that holds it, each file named by its part's directory; parts that disagree are refused."""

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.workers.dcp_reader import RestrictedLoadPlanner, VerifiedReader
from ftrain.workers.merged_metadata import merged


def _part(root: Path, name: str, state: dict[str, Any]) -> tuple[str, Metadata]:
    dcp_save(state, storage_writer=FileSystemWriter(root / name), no_dist=True)
    return name, FileSystemReader(root / name).read_metadata()


def test_two_parts_load_as_one_checkpoint(tmp_path: Path) -> None:
    weight = torch.arange(6.0).reshape(2, 3)
    parts = [
        _part(tmp_path, "rank-0", {"w": weight, "progress": {"step": 6}, "rng/0": b"zero"}),
        _part(tmp_path, "replica-1", {"w": weight + 100, "rng/1": b"one", "only/1": torch.ones(2)}),
    ]
    whole = merged(parts)
    assert isinstance(whole, Metadata)
    target: dict[str, Any] = {
        "w": torch.zeros(2, 3),
        "progress": {"step": 0},
        "rng/1": b"",
        "only/1": torch.zeros(2),
    }
    dcp_load(
        target, storage_reader=VerifiedReader(tmp_path, whole), planner=RestrictedLoadPlanner(), no_dist=True
    )
    assert torch.equal(target["w"], weight), "a chunk both hold: the first part's"
    assert target["progress"] == {"step": 6} and target["rng/1"] == b"one"
    assert torch.equal(target["only/1"], torch.ones(2))


def test_parts_that_disagree_on_an_item_are_refused(tmp_path: Path) -> None:
    parts = [
        _part(tmp_path, "rank-0", {"w": torch.zeros(2, 3)}),
        _part(tmp_path, "rank-1", {"w": torch.zeros(3, 3)}),
    ]
    assert merged(parts) == "the parts disagree on w's size: [2, 3] and [3, 3]"
    parts[1] = _part(tmp_path, "rank-2", {"w": b"bytes"})
    assert merged(parts) == "the parts disagree on w: a tensor in one, not in another"
