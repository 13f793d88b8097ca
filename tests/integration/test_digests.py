"""Digest agility, end to end in one process: a trainer configured for BLAKE3 (`FTRAIN_DIGEST`) saves and
resumes exactly and a flipped byte is caught; the checkpoint a trainer wrote before BLAKE3 existed
(`tests/vectors/trainer-checkpoint/`, manifest format 2, and the same rewritten in format 1) still verifies and
loads whatever the setting says, since verification follows what the manifest names; `ftrain checkpoint`
takes the same setting, and a bad one is refused in one line, exit 2 (the algorithms: tests/unit/test_layout.py,
the refusal of an unknown one: tests/unit/test_storage_verdicts.py, S3: tests/integration/test_saving.py)."""

import hashlib
import json
import shutil
from pathlib import Path

import msgspec
import pytest
import torch
from torch import nn

from ftrain.train.checkpointing import CheckpointManager
from ftrain.workers.integrity import to_hex
from ftrain.workers.manifest import decode_manifest, decode_marker
from ftrain.workers.storage.file.checkpoint_dir import verify_checkpoint
from tests.integration.test_training_api import _train
from tests.support.cli import RUN, Cli, checkpoint, launch
from tests.support.paths import VECTORS

BEFORE = VECTORS / "trainer-checkpoint"
"""A single-process trainer's step 5 (nn.Linear(4, 1), Adam), written by ftrain before BLAKE3, with the
weights it had (`weights.json`)."""


@pytest.fixture
def outside_ftrain_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    for name in ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_CHECKPOINT_EVERY", "FTRAIN_DATASET_REVISION"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("outside_ftrain_run")
def test_a_trainer_saving_with_blake3_resumes_exactly_and_a_flipped_byte_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _train(tmp_path / "whole", 12)  # SHA-256, uninterrupted: the reference
    monkeypatch.setenv("FTRAIN_DIGEST", "blake3")
    assert _train(tmp_path / "cut", 12, stop_at=10)[0] == 10
    step10 = tmp_path / "cut" / "step-10"
    manifest = decode_manifest((step10 / "manifest.json").read_bytes())
    assert {f.algorithm for f in manifest.files} == {"blake3"}
    marker = decode_marker((step10 / ".complete").read_bytes())
    assert (
        marker.manifest_digest
        == "sha256:" + hashlib.sha256((step10 / "manifest.json").read_bytes()).hexdigest()
    )
    assert verify_checkpoint(step10, to_hex(marker.manifest_digest)) is None

    shard = step10 / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one byte, the size unchanged
    shard.write_bytes(bytes(data))
    assert verify_checkpoint(step10, to_hex(marker.manifest_digest)) == "file __0_0.distcp hash mismatch"

    step, weights, seen = _train(tmp_path / "cut", 12)  # skips step 10, resumes from step 5
    assert (step, seen) == (12, 12)
    assert all(torch.equal(a, b) for a, b in zip(weights, whole[1], strict=True))
    assert len(list((tmp_path / "cut").glob("step-10.corrupt-*"))) == 1, "set aside, kept as evidence"
    marker = decode_marker((step10 / ".complete").read_bytes())  # step 10 trained and saved again
    assert verify_checkpoint(step10, to_hex(marker.manifest_digest)) is None


def as_format_1(step: Path) -> None:
    """Rewrite a format-2 checkpoint as format 1 wrote it: bare hex `sha256` per file, `manifest_sha256`."""
    manifest = json.loads((step / "manifest.json").read_bytes())
    manifest["format"] = 1
    manifest["files"] = [
        {"name": f["name"], "size": f["size"], "sha256": f["digest"].removeprefix("sha256:")}
        for f in manifest["files"]
    ]
    raw = json.dumps(manifest).encode()
    (step / "manifest.json").write_bytes(raw)
    marker = {"manifest_sha256": hashlib.sha256(raw).hexdigest(), "step": 5}
    (step / ".complete").write_bytes(json.dumps(marker).encode())


@pytest.mark.usefixtures("outside_ftrain_run")
@pytest.mark.parametrize("form", [2, 1])
@pytest.mark.parametrize("setting", ["sha256", "blake3"])
def test_a_trainer_checkpoint_from_before_blake3_still_verifies_and_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: int, setting: str
) -> None:
    monkeypatch.setenv(
        "FTRAIN_DIGEST", setting
    )  # what new files would use: the old ones are checked as named
    run = tmp_path / "vector-dcp"
    shutil.copytree(BEFORE / "step-5", run / "step-5")
    if form == 1:
        as_format_1(run / "step-5")
    raw = (run / "step-5" / "manifest.json").read_bytes()
    assert msgspec.json.decode(raw)["format"] == form
    assert {f.algorithm for f in decode_manifest(raw).files} == {"sha256"}
    assert verify_checkpoint(run / "step-5", hashlib.sha256(raw).hexdigest()) is None

    torch.manual_seed(1)  # other weights than the checkpoint's
    model = nn.Linear(4, 1)
    ckpt = CheckpointManager(run, model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.1))
    try:
        assert ckpt.load() == 5
    finally:
        ckpt.close()
    assert not torch.distributed.is_initialized()
    expected = json.loads((BEFORE / "weights.json").read_text())
    assert {n: p.detach().tolist() for n, p in model.named_parameters()} == expected


def test_ftrain_checkpoint_hashes_with_the_setting_and_a_bad_one_is_refused_before_anything_is_written(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch(cli)
    monkeypatch.setenv("FTRAIN_DIGEST", "blake3")
    checkpoint(cli, 500, 2)
    step = cli.storage() / RUN / "step-500"
    assert [f.algorithm for f in decode_manifest((step / "manifest.json").read_bytes()).files] == ["blake3"]
    monkeypatch.setenv("FTRAIN_DIGEST", "md5")
    code, out, err = cli(
        "checkpoint", RUN, "--step", "1000", "--epoch", "5", "--shards", "1", "--state", "{}"
    )
    assert (code, out, err) == (
        2,
        "",
        "ftrain checkpoint: error: FTRAIN_DIGEST='md5': use one of sha256, blake3\n",
    )
    assert not (cli.storage() / RUN / "step-1000").exists()
    monkeypatch.setenv(
        "FTRAIN_DIGEST", "sha256"
    )  # the resume checks step 500 by blake3, as its manifest says
    cli.ok("fail", RUN)
    assert cli.ok("resume", RUN)[0].startswith(f"Resuming {RUN} from step 500 epoch 2 ")
