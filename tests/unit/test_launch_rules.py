"""Each rule a launch spec is validated by, at its boundary: the least that is accepted and the first refusal."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ftrain.supervise.launch_spec import DEFAULT_TRAIN_CMD, LaunchSpec, LaunchSpecError, build_command

TORCHRUN = ["torchrun", "--nnodes=1", "--nproc_per_node=4", "--rdzv_backend=c10d", "--rdzv_endpoint=n1:29500",
            "--rdzv_id=r"]  # fmt: skip


def spec(**overrides: Any) -> LaunchSpec:
    fields: dict[str, Any] = {"run_id": "r", "nodes": 1, "gpus_per_node": 4, "strategy": "fsdp", "rdzv_host": "n1",
                              "train_cmd": DEFAULT_TRAIN_CMD}  # fmt: skip
    fields.update(overrides)
    return LaunchSpec(**fields)


def refused(message: str, **overrides: Any) -> None:
    with pytest.raises(LaunchSpecError, match=f"^{re.escape(message)}$"):
        build_command(spec(**overrides))


def test_torchrun_restarts_are_never_negative() -> None:
    refused("max_restarts must be >= 0, got -1", max_restarts=-1)


@pytest.mark.parametrize(
    ("restarts", "option"), [(0, []), (1, ["--max_restarts=1"]), (3, ["--max_restarts=3"])]
)
def test_torchrun_restarts_are_passed_only_above_torchruns_default(restarts: int, option: list[str]) -> None:
    assert build_command(spec(max_restarts=restarts)) == [*TORCHRUN, *option, *DEFAULT_TRAIN_CMD]


def test_only_zero_needs_a_deepspeed_config() -> None:
    refused("zero strategy needs a deepspeed_config path", strategy="zero", deepspeed_config="")
    assert build_command(spec(deepspeed_config="")) == [*TORCHRUN, *DEFAULT_TRAIN_CMD]
    megatron = build_command(spec(strategy="megatron", deepspeed_config=""))
    assert megatron == [*TORCHRUN, *DEFAULT_TRAIN_CMD, "--tensor-model-parallel-size", "1",
                        "--pipeline-model-parallel-size", "1"]  # fmt: skip


@pytest.mark.parametrize(("tp", "pp"), [(2, 4), (4, 4), (1, 8)])
def test_megatron_needs_the_product_of_its_parallel_sizes_to_divide_the_world(tp: int, pp: int) -> None:
    refused(
        f"megatron: tensor_parallel*pipeline_parallel ({tp}*{pp}={tp * pp}) must divide "
        "nodes*gpus_per_node (1*4=4)",
        strategy="megatron", tensor_parallel=tp, pipeline_parallel=pp,
    )  # fmt: skip


def test_megatron_tensor_parallel_may_fill_exactly_one_node() -> None:
    argv = build_command(spec(nodes=2, strategy="megatron", tensor_parallel=4, pipeline_parallel=2))
    assert argv[-4:] == ["--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2"]


@pytest.mark.parametrize(
    "train_cmd",
    [("--no-python", "./train"), ("-m", "train"), ("--module", "train"), ("train.py",)],
)
def test_the_shortest_training_command_of_each_form_is_placed_as_given(train_cmd: tuple[str, ...]) -> None:
    assert build_command(spec(train_cmd=train_cmd)) == [*TORCHRUN, *train_cmd]


@pytest.mark.parametrize(
    ("train_cmd", "message"),
    [
        (("--no-python",), "training command '--no-python' names no executable"),
        (("-m",), "training command '-m': -m needs a module name"),
        (("--module",), "training command '--module': --module needs a module name"),
    ],
)
def test_a_training_command_one_word_short_is_refused(train_cmd: tuple[str, ...], message: str) -> None:
    refused(message, train_cmd=train_cmd)


def test_the_smallest_world_is_one_gpu_on_one_node() -> None:
    argv = build_command(spec(gpus_per_node=1))
    assert argv[1:3] == ["--nnodes=1", "--nproc_per_node=1"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"train_cmd": ()}, "training command is empty"),
        ({"train_cmd": ("-u", "x.py")},
         "training command starts with unsupported option '-u'; only -m/--module or --no-python may come first"),
        ({"strategy": "horovod"}, "unknown strategy 'horovod' (expected one of fsdp, ddp, zero, megatron, none)"),
        ({"run_id": ""}, "run_id must not be empty"),
        ({"strategy": "megatron", "tensor_parallel": 8, "pipeline_parallel": 1, "nodes": 2},
         "megatron: tensor_parallel 8 exceeds gpus_per_node 4 (tensor parallel groups must stay inside one node)"),
    ],
)  # fmt: skip
def test_each_refusal_is_one_exact_line(overrides: dict[str, Any], message: str) -> None:
    refused(message, **overrides)
