"""The CUDA path where no GPU is: how the reference trainer picks its device (`scripts/gpu_check.sh` up to its
first step: tests/integration/test_gpu_check.py)."""

import os

import pytest
import torch

from ftrain.examples import train


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
