"""Exact torchrun argv per strategy, training-command placement, and spec validation."""

from __future__ import annotations

import shlex
from typing import Any

import msgspec
import pytest

from ftrain.supervise.launch_spec import (
    DEFAULT_TRAIN_CMD,
    STRATEGIES,
    LaunchSpec,
    LaunchSpecError,
    build_command,
    format_command,
)

TORCHRUN = [
    "torchrun",
    "--nnodes=2",
    "--nproc_per_node=4",
    "--rdzv_backend=c10d",
    "--rdzv_endpoint=node07:29500",
    "--rdzv_id=run-42",
]


def _spec(**overrides: Any) -> LaunchSpec:
    fields: dict[str, Any] = {
        "run_id": "run-42",
        "nodes": 2,
        "gpus_per_node": 4,
        "strategy": "fsdp",
        "rdzv_host": "node07",
        "train_cmd": DEFAULT_TRAIN_CMD,
    }
    fields.update(overrides)
    return LaunchSpec(**fields)


def test_constants() -> None:
    assert STRATEGIES == ("fsdp", "ddp", "zero", "megatron", "none")
    assert DEFAULT_TRAIN_CMD == ("-m", "ftrain.examples.train")
    assert issubclass(LaunchSpecError, ValueError)


def test_spec_defaults_and_frozen() -> None:
    spec = _spec()
    assert (spec.rdzv_port, spec.tensor_parallel, spec.pipeline_parallel) == (29500, 1, 1)
    assert spec.deepspeed_config == "ds_config.json"
    with pytest.raises(AttributeError):
        spec.nodes = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        LaunchSpec("run", 1, 1, "fsdp", "h", 29500, ("a.py",))  # type: ignore[call-arg]
    assert msgspec.json.decode(msgspec.json.encode(spec), type=LaunchSpec) == spec


# --------------------------------------------------------------------------- strategies


def test_fsdp_argv() -> None:
    assert build_command(_spec()) == [*TORCHRUN, "-m", "ftrain.examples.train"]


def test_zero_argv() -> None:
    spec = _spec(strategy="zero", train_cmd=("-m", "ftrain.examples.train", "--steps", "10"))
    assert build_command(spec) == [
        *TORCHRUN,
        "-m",
        "ftrain.examples.train",
        "--steps",
        "10",
        "--deepspeed",
        "--deepspeed_config",
        "ds_config.json",
    ]


def test_zero_custom_config() -> None:
    spec = _spec(strategy="zero", deepspeed_config="/cfg/zero3.json", train_cmd=("train.py",))
    assert build_command(spec) == [
        *TORCHRUN,
        "train.py",
        "--deepspeed",
        "--deepspeed_config",
        "/cfg/zero3.json",
    ]


def test_megatron_argv() -> None:
    spec = _spec(strategy="megatron", tensor_parallel=4, pipeline_parallel=2)
    assert build_command(spec) == [
        *TORCHRUN,
        "-m",
        "ftrain.examples.train",
        "--tensor-model-parallel-size",
        "4",
        "--pipeline-model-parallel-size",
        "2",
    ]


def test_megatron_defaults_to_one_by_one() -> None:
    assert build_command(_spec(strategy="megatron"))[-4:] == [
        "--tensor-model-parallel-size",
        "1",
        "--pipeline-model-parallel-size",
        "1",
    ]


def test_fsdp_ignores_parallel_sizes_and_deepspeed_config() -> None:
    spec = _spec(tensor_parallel=8, pipeline_parallel=3, deepspeed_config="x.json")
    assert build_command(spec) == [*TORCHRUN, "-m", "ftrain.examples.train"]


def test_rendezvous_options_follow_spec() -> None:
    spec = _spec(run_id="r1", nodes=1, gpus_per_node=8, rdzv_host="10.0.0.5", rdzv_port=1)
    assert build_command(spec)[:6] == [
        "torchrun",
        "--nnodes=1",
        "--nproc_per_node=8",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=10.0.0.5:1",
        "--rdzv_id=r1",
    ]


# --------------------------------------------------------------------------- train_cmd placement


@pytest.mark.parametrize(
    ("train_cmd", "placed"),
    [
        (("-m", "pkg.mod", "--lr", "3e-4"), ["-m", "pkg.mod", "--lr", "3e-4"]),
        (("--module", "pkg.mod"), ["--module", "pkg.mod"]),
        (("train.py", "--lr", "1"), ["train.py", "--lr", "1"]),
        (("scripts/train.py",), ["scripts/train.py"]),
        (("python", "train.py", "--x"), ["train.py", "--x"]),
        (("python3", "-m", "pkg.mod", "a"), ["-m", "pkg.mod", "a"]),
        (("python", "-u", "train.py"), ["--no-python", "python", "-u", "train.py"]),
        (("python3", "-c", "print(1)"), ["--no-python", "python3", "-c", "print(1)"]),
        (("./bin/train", "--steps", "5"), ["--no-python", "./bin/train", "--steps", "5"]),
        (("/opt/venv/bin/python", "train.py"), ["--no-python", "/opt/venv/bin/python", "train.py"]),
        (("bash", "run.sh"), ["--no-python", "bash", "run.sh"]),
        (("--no-python", "./bin/train", "a"), ["--no-python", "./bin/train", "a"]),
    ],
)
def test_train_cmd_placement(train_cmd: tuple[str, ...], placed: list[str]) -> None:
    assert build_command(_spec(train_cmd=train_cmd)) == [*TORCHRUN, *placed]


def test_strategy_args_follow_no_python_command() -> None:
    spec = _spec(strategy="zero", train_cmd=("./bin/train", "--x"))
    assert build_command(spec) == [
        *TORCHRUN,
        "--no-python",
        "./bin/train",
        "--x",
        "--deepspeed",
        "--deepspeed_config",
        "ds_config.json",
    ]


@pytest.mark.parametrize(
    ("train_cmd", "message"),
    [
        ((), "training command is empty"),
        (("",), "training command is empty"),
        (("python",), "names no script or module"),
        (("python3",), "names no script or module"),
        (("-m",), "-m needs a module name"),
        (("python", "-m"), "-m needs a module name"),
        (("-m", "--lr"), "-m needs a module name"),
        (("--module", ""), "--module needs a module name"),
        (("--no-python",), "names no executable"),
        (("-u", "train.py"), "unsupported option '-u'"),
        (("--nnodes=8", "train.py"), "unsupported option '--nnodes=8'"),
    ],
)
def test_train_cmd_errors(train_cmd: tuple[str, ...], message: str) -> None:
    with pytest.raises(LaunchSpecError, match=message) as info:
        build_command(_spec(train_cmd=train_cmd))
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"strategy": "horovod"}, "unknown strategy 'horovod'"),
        ({"strategy": "FSDP"}, "unknown strategy 'FSDP'"),
        ({"run_id": ""}, "run_id must not be empty"),
        ({"nodes": 0}, "nodes must be >= 1, got 0"),
        ({"nodes": -1}, "nodes must be >= 1, got -1"),
        ({"gpus_per_node": 0}, "gpus_per_node must be >= 1, got 0"),
        ({"rdzv_port": 0}, r"rdzv_port must be in 1\.\.65535, got 0"),
        ({"rdzv_port": 65536}, r"rdzv_port must be in 1\.\.65535, got 65536"),
        ({"rdzv_host": ""}, "invalid rendezvous host ''"),
        ({"rdzv_host": "node07:1234"}, "invalid rendezvous host 'node07:1234'"),
        ({"rdzv_host": "node 7"}, "invalid rendezvous host 'node 7'"),
        ({"strategy": "zero", "deepspeed_config": ""}, "zero strategy needs a deepspeed_config"),
        (
            {"strategy": "megatron", "tensor_parallel": 0},
            "tensor_parallel and pipeline_parallel must be >= 1, got 0 and 1",
        ),
        (
            {"strategy": "megatron", "pipeline_parallel": -2},
            "tensor_parallel and pipeline_parallel must be >= 1, got 1 and -2",
        ),
        (
            {"strategy": "megatron", "tensor_parallel": 2, "pipeline_parallel": 3},
            r"\(2\*3=6\) must divide nodes\*gpus_per_node \(2\*4=8\)",
        ),
        (
            {"strategy": "megatron", "tensor_parallel": 8, "pipeline_parallel": 1},
            "tensor_parallel 8 exceeds gpus_per_node 4",
        ),
    ],
)
def test_validation_errors(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(LaunchSpecError, match=message) as info:
        build_command(_spec(**overrides))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("port", [1, 65535])
def test_port_bounds_accepted(port: int) -> None:
    assert f"--rdzv_endpoint=node07:{port}" in build_command(_spec(rdzv_port=port))


@pytest.mark.parametrize(("tp", "pp"), [(4, 2), (1, 8), (2, 4), (4, 1), (1, 1)])
def test_megatron_valid_layouts(tp: int, pp: int) -> None:
    argv = build_command(_spec(strategy="megatron", tensor_parallel=tp, pipeline_parallel=pp))
    assert argv[-4:] == ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)]


def test_megatron_tp_across_nodes_rejected_even_if_it_divides() -> None:
    # tp=8 divides 2*4=8 but would span two nodes.
    spec = _spec(strategy="megatron", tensor_parallel=8, pipeline_parallel=1)
    with pytest.raises(LaunchSpecError, match="must stay inside one node"):
        build_command(spec)


# --------------------------------------------------------------------------- format


def test_format_command_quotes_and_roundtrips() -> None:
    argv = build_command(_spec(run_id="my run", train_cmd=("train.py", "--note", "it's $HOME")))
    text = format_command(argv)
    assert text.startswith("torchrun --nnodes=2 --nproc_per_node=4 ")
    assert "'--rdzv_id=my run'" in text
    assert shlex.split(text) == argv


def test_format_command_plain() -> None:
    assert format_command(["torchrun", "-m", "a.b"]) == "torchrun -m a.b"
