"""`ftrain export` against a real log and real checkpoints written by the trainer in this process (one
process, its own private group): the weights come out bit for bit as the trainer's (safetensors, one file or
sharded, and torch with the optimizer), from a file system and from S3 (SeaweedFS); a corrupt checkpoint is
refused naming its file; every refusal writes nothing (issue 35)."""

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from ftrain.train.checkpointing import CheckpointManager
from tests.support.cli import RUN, Cli, launch
from tests.support.s3 import Endpoint

STEPS = 4
NOBODY = 65534


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(location: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The trainer's loop on a logged run, saving every step; the model and optimizer as they ended."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    ckpt = CheckpointManager(location, model=model, optimizer=optimizer, run_id=RUN, every=1)
    try:
        assert ckpt.load() == 0
        for step in range(1, STEPS + 1):
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            ckpt.save(step)
    finally:
        ckpt.close()
    return model, optimizer


def params_sha256(named: Mapping[str, torch.Tensor]) -> str:
    """The reference trainer's FINAL `params_sha256` (`ftrain.examples.train.params_digest`): the parameters
    in name order, each as `name:dtype:shape;` then its bytes."""
    digest = hashlib.sha256()
    for name, param in sorted(named.items()):
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def _checked(out: Path) -> dict[str, str]:
    """The export's SHA256SUMS, checked by `sha256sum -c`; each file's digest by name."""
    done = subprocess.run(
        ["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=out, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert set(sums) | {"SHA256SUMS"} == {p.name for p in out.iterdir()}
    return sums


def _private(out: Path) -> None:
    assert out.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in out.iterdir())


@pytest.fixture
def trained(cli: Cli) -> tuple[nn.Module, torch.optim.Optimizer]:
    launch(cli)
    return _train(cli.storage() / RUN)


def test_safetensors_reproduce_the_trainers_params_sha256(
    cli: Cli, trained: tuple[nn.Module, torch.optim.Optimizer], tmp_path: Path
) -> None:
    model, _ = trained
    out = tmp_path / "weights"
    lines = cli.ok("export", RUN, "--to", str(out))
    assert lines[0].startswith(f"Exported {RUN} step {STEPS} (checkpoint ")
    tensors = load_file(out / "model.safetensors")
    assert sorted(tensors) == sorted(model.state_dict())  # the model's own names, no container prefix
    assert params_sha256(tensors) == params_sha256(_params(model))
    sums = _checked(out)
    assert sorted(sums) == ["export.json", "model.safetensors"]
    provenance = json.loads((out / "export.json").read_text())
    status = json.loads(cli.ok("status", RUN, "--json")[0])
    assert provenance["checkpoint_hash"] == status["checkpoints"][-1]["checkpoint_hash"]
    assert (provenance["run_id"], provenance["step"], provenance["format"]) == (RUN, STEPS, "safetensors")
    summed = hashlib.sha256((out / "SHA256SUMS").read_bytes()).hexdigest()
    assert lines[-1].startswith(f"digest sha256:{summed} ")
    assert f"sha256:{sums['model.safetensors']}  model.safetensors" in lines
    _private(out)


def test_sharded_safetensors_carry_an_index_as_hugging_face_writes_it(
    cli: Cli, trained: tuple[nn.Module, torch.optim.Optimizer], tmp_path: Path
) -> None:
    model, _ = trained
    out = tmp_path / "sharded"
    doc = json.loads(
        cli.ok("export", RUN, "--step", "2", "--to", str(out), "--max-shard-size", "1kB", "--json")[0]
    )
    assert set(doc) == {"run_id", "step", "checkpoint_hash", "format", "dir", "files", "digest"}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(load_file(out / shard))
    assert set(index["weight_map"]) == set(tensors) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert doc["step"] == 2 and {f["name"] for f in doc["files"]} == {*shards, "model.safetensors.index.json",
                                                                      "export.json", "SHA256SUMS"}  # fmt: skip
    _checked(out)


def test_torch_format_holds_the_model_and_with_it_the_optimizer(
    cli: Cli, trained: tuple[nn.Module, torch.optim.Optimizer], tmp_path: Path
) -> None:
    model, optimizer = trained
    out = tmp_path / "torch"
    out.mkdir(mode=0o700)  # an empty directory of this user's is taken
    cli.ok("export", RUN, "--to", str(out), "--format", "torch", "--with-optimizer")
    fresh = _model()
    fresh.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    assert params_sha256(_params(fresh)) == params_sha256(_params(model))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.5)
    set_optimizer_state_dict(fresh, fresh_optimizer, torch.load(out / "optimizer.pt", weights_only=True))
    ours, theirs = (
        get_optimizer_state_dict(fresh, fresh_optimizer),
        get_optimizer_state_dict(model, optimizer),
    )
    assert ours["param_groups"] == theirs["param_groups"]
    for name, state in theirs["state"].items():
        assert all(torch.equal(ours["state"][name][k], v) for k, v in state.items())
    assert sorted(_checked(out)) == ["export.json", "model.pt", "optimizer.pt"]


def _refused(cli: Cli, code: int, *args: str) -> str:
    """`ftrain export ARGS` refused with `code` and one line, the log untouched."""
    before = cli.last_seq()
    got, out, err = cli("export", *args)
    assert (got, out, err.count("\n")) == (code, "", 1), err
    assert cli.last_seq() == before
    return err


def test_a_corrupt_checkpoint_is_refused_naming_its_file_and_nothing_is_written(
    cli: Cli, trained: tuple[nn.Module, torch.optim.Optimizer], tmp_path: Path
) -> None:
    shard = cli.storage() / RUN / f"step-{STEPS}" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    parent = tmp_path / "out"
    parent.mkdir(mode=0o700)
    err = _refused(cli, 1, RUN, "--to", str(parent / "w"))
    assert "__0_0.distcp" in err and f"step {STEPS}" in err, err
    assert list(parent.iterdir()) == []  # no partial output, no work directory left behind
    cli.ok("export", RUN, "--step", str(STEPS - 1), "--to", str(parent / "w"))  # an older one is fine


def test_bad_input_is_refused_before_anything_is_read_or_written(
    cli: Cli, trained: tuple[nn.Module, torch.optim.Optimizer], tmp_path: Path
) -> None:
    full = tmp_path / "full"
    full.mkdir(mode=0o700)
    (full / "mine.txt").write_text("keep")
    assert "not empty" in _refused(cli, 2, RUN, "--to", str(full))
    assert [p.name for p in full.iterdir()] == ["mine.txt"]
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o770)
    assert "writable by group or others" in _refused(cli, 2, RUN, "--to", str(shared))
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)  # anyone could swap the export for their own before it is used
    assert "writable by group or others" in _refused(cli, 2, RUN, "--to", str(open_parent / "w"))
    assert list(open_parent.iterdir()) == [] and list(shared.iterdir()) == []
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)  # another user's, empty: whatever they put there later is theirs
    assert f"owned by uid {NOBODY}" in _refused(cli, 2, RUN, "--to", str(theirs))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    assert "symbolic link" in _refused(cli, 2, RUN, "--to", str(link))
    target = str(tmp_path / "w")
    assert "--format torch" in _refused(cli, 2, RUN, "--to", target, "--with-optimizer")
    assert "unknown run" in _refused(cli, 1, "no-such-run", "--to", target)
    assert "no checkpoint at step 7 (valid steps: 2, 3, 4)" in _refused(
        cli, 1, RUN, "--step", "7", "--to", target
    )
    assert "not a size" in _refused(cli, 2, RUN, "--to", target, "--max-shard-size", "big")
    assert not (tmp_path / "w").exists() and not (tmp_path / "elsewhere").exists()
    assert not list(tmp_path.glob(".*.export-*"))  # no work directory left beside a target


def test_a_checkpoint_on_s3_exports_the_same_weights_and_a_corrupt_one_is_refused(
    cli: Cli, weed: Endpoint, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = f"s3://{weed.new_bucket()}/ckpt"
    for key, value in {**weed.env(), "FTRAIN_STORAGE": root}.items():
        monkeypatch.setenv(key, value)
        cli.env[key] = value
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the downloads' work directory, checked
    (tmp_path / "tmp").mkdir(mode=0o700)
    launch(cli)
    model, _ = _train(f"{root}/{RUN}")
    out = tmp_path / "weights"
    cli.ok("export", RUN, "--to", str(out))
    assert params_sha256(load_file(out / "model.safetensors")) == params_sha256(_params(model))
    assert not list((tmp_path / "tmp").glob("ftrain-export-*"))
    client, bucket = weed.client(), root.removeprefix("s3://").split("/")[0]
    key = f"ckpt/{RUN}/step-{STEPS}/__0_0.distcp"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    err = _refused(cli, 1, RUN, "--to", str(tmp_path / "again"))
    assert "__0_0.distcp" in err, err
    assert not (tmp_path / "again").exists()
    assert not list((tmp_path / "tmp").glob("ftrain-export-*"))  # the downloads went with the refusal
    # the trainer's staging alone (torch's own inductor cache may appear there too: not ftrain's)
    assert [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")] == [
        f"ftrain-{os.getuid()}"
    ]
