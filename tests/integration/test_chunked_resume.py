"""Manifest format 3 end to end in one process: a trainer's data files list a digest per chunk, a resume checks
each chunk as DCP reads it (a file out of the page cache), and a flip in the last chunk of the last data file,
found only after DCP loaded the items before it, refuses the checkpoint as a whole-file check would: the load
falls back to the step before and everything it had half-loaded is overwritten (the weights end as an
uninterrupted run's). A file in the page cache is checked whole before the load, refused before any parse."""

from pathlib import Path

import pytest
import torch

import ftrain.workers.dcp_writer
from ftrain.workers.integrity import hash_file
from ftrain.workers.manifest import FORMAT, decode_manifest, decode_marker
from ftrain.workers.storage.file.checkpoint_dir import verify_checkpoint
from ftrain.workers.verified_chunks import LocalChunks, Segments, VerifiedChunks
from tests.integration.test_digests import outside_ftrain_run as outside_ftrain_run
from tests.integration.test_training_api import _train
from tests.support.page_cache import evict

CHUNK = 4096
"""Small chunks, so the trainer's few-KB shard has several."""


def spy_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count, by step directory, the items whose verified bytes the reader handed to DCP."""
    handed: dict[str, int] = {}
    real = VerifiedChunks.read

    def read(self: VerifiedChunks, name: str, offset: int, length: int) -> Segments:
        data = real(self, name, offset, length)
        assert isinstance(self._source, LocalChunks)
        step = self._source.root.name
        handed[step] = handed.get(step, 0) + 1
        return data

    monkeypatch.setattr(VerifiedChunks, "read", read)
    return handed


@pytest.mark.usefixtures("outside_ftrain_run")
@pytest.mark.parametrize(("algorithm", "on_disk"), [("sha256", True), ("blake3", True), ("sha256", False)])
def test_a_flip_in_the_last_chunk_of_the_last_file_falls_back_and_restores_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str, on_disk: bool
) -> None:
    monkeypatch.setenv("FTRAIN_DIGEST", algorithm)
    monkeypatch.setattr(ftrain.workers.dcp_writer, "DIGEST_CHUNK", CHUNK)
    whole = _train(tmp_path / "whole", 12)
    assert _train(tmp_path / "cut", 12, stop_at=10)[0] == 10
    step10 = tmp_path / "cut" / "step-10"
    manifest = decode_manifest((step10 / "manifest.json").read_bytes())
    assert manifest.format == FORMAT == 3
    last = max((f for f in manifest.files if f.name.endswith(".distcp")), key=lambda f: f.name)
    assert last.chunk_size == CHUNK and len(last.chunks) > 2 and last.algorithm == algorithm
    assert hash_file(step10 / last.name, algorithm, CHUNK).chunks == last.chunks
    marker = decode_marker((step10 / ".complete").read_bytes())
    assert verify_checkpoint(step10, marker.manifest_digest.removeprefix("sha256:")) is None

    data = bytearray((step10 / last.name).read_bytes())
    data[-1] ^= 0x01  # the last byte of the last chunk: every earlier chunk checks out
    (step10 / last.name).write_bytes(bytes(data))
    if on_disk:
        for entry in manifest.files:
            evict(step10 / entry.name)

    handed = spy_reads(monkeypatch)
    step, weights, seen = _train(tmp_path / "cut", 12)  # refuses step 10, resumes from step 5
    if on_disk:
        assert handed["step-10"] > 0, "DCP had parsed step 10's verified items before its last chunk failed"
    else:
        assert "step-10" not in handed, "in the page cache: checked whole, refused before any parse"
    assert (step, seen) == (12, 12)
    assert all(torch.equal(a, b) for a, b in zip(weights, whole[1], strict=True))
    assert len(list((tmp_path / "cut").glob("step-10.corrupt-*"))) == 1, "set aside, kept as evidence"
