"""The CUDA path where no GPU is: how the reference trainer picks its device, and `scripts/gpu_check.sh` up to
its first step (its full run, on a GPU or as a `--cpu` dry run, takes minutes: not part of the suite)."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from ftrain.examples import train

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Two visible GPUs as torch would report them; the calls that set a device or determinism, in order."""
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *a, **kw: calls.append((a, kw)))
    monkeypatch.setattr(os, "environ", {"LOCAL_RANK": "1"})
    return calls


def test_each_rank_trains_on_its_own_gpu_over_nccl_with_deterministic_kernels(cuda: list[object]) -> None:
    assert train.training_device() == (torch.device("cuda", 1), "nccl")
    assert cuda == [((True,), {"warn_only": True}), torch.device("cuda", 1)]
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # cuBLAS's deterministic workspace


def test_a_rank_without_a_gpu_of_its_own_exits_2_in_one_line(
    cuda: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    os.environ["LOCAL_RANK"] = "2"
    with pytest.raises(SystemExit) as exit_:
        train.training_device()
    assert exit_.value.code == 2 and cuda == []
    assert capsys.readouterr().err == (
        "train: local rank 2 has no GPU of its own (2 visible): start at most 2 processes per node\n"
    )


def test_gpu_check_parses_and_without_a_gpu_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    nvidia_smi = tmp_path / "nvidia-smi"  # what it prints on a machine whose driver finds no GPU
    nvidia_smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    nvidia_smi.chmod(0o755)
    done = subprocess.run(
        [str(SCRIPT)],
        env=os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("gpu_check: no CUDA device visible") and done.stderr.count("\n") == 1
