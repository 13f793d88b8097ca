"""Exact data and randomness with the loaders people use: each loader killed mid-run (SIGKILL) resumes to the
uninterrupted run's losses bit for bit, dropout included, from a directory and from S3 (the session's
SeaweedFS); a run shrunk from 4 ranks to 2 and grown back to 4 trains every step on the uninterrupted 4-rank
run's samples; a per-rank loader on another world is refused, or with `world_change="warn"` goes on after one
warning. (The sampler's arithmetic: tests/unit/test_global_sampler.py.)"""

import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from tests.support.processes import free_port
from tests.support.s3 import Endpoint

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-6
"""Final parameters of a run that changed its world agree with the uninterrupted run's to this (absolute): only
the float summation order differs (4.5e-8 measured on 2026-12-05, parameters up to 0.27)."""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "FTRAIN_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
    }
    for name in ("FTRAIN_KILL_AT", "FTRAIN_KILL_ONCE", "FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_ATTEMPT",
                 "FTRAIN_LOG_LEVEL"):  # fmt: skip
        env.pop(name, None)
    return {**env, **extra}


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # a session of its own: a kill point signals the job's process group, workers included
    return subprocess.run(
        command,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        start_new_session=True,
    )


def _torchrun(nproc: int, module: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", module, *args,
    ]  # fmt: skip


def _losses(path: Path) -> dict[int, float]:
    """Each step's loss, the last written winning (a resumed run writes the steps after its checkpoint again)."""
    return {line["step"]: line["loss"] for line in map(json.loads, path.read_text().splitlines())}


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("loader", "saving", "storage"),
    [
        ("stateful", "sync", "file"),
        ("stateful-shuffle", "async", "file"),
        ("global", "async", "file"),
        ("own", "sync", "file"),
        ("global", "async", "s3"),
        ("stateful", "sync", "s3"),
    ],
)
def test_each_loader_killed_mid_run_resumes_to_the_uninterrupted_losses_bit_exact(
    request: pytest.FixtureRequest, tmp_path: Path, loader: str, saving: str, storage: str
) -> None:
    s3: dict[str, str] = {}
    location = "run"
    if storage == "s3":
        weed: Endpoint = request.getfixturevalue("weed")  # only here: the file cases start no SeaweedFS
        s3, location = weed.env(), f"s3://{weed.new_bucket()}/ckpt/run"
    job = [sys.executable, "-m", "tests.support.loader_job", "--loader", loader, "--location", location]
    job += ["--async-save"] if saving == "async" else []
    killed = _run(
        [*job, "--losses", "resumed.jsonl"], _env(tmp_path, FTRAIN_KILL_AT="step:17", **s3), tmp_path
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert max(_losses(tmp_path / "resumed.jsonl")) == 17
    resumed = _run(
        [*job, "--losses", "resumed.jsonl", "--reference", "ref", "ref.jsonl"], _env(tmp_path, **s3), tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # saved at 15 (async: the save of 15 may still have been in flight, then from 10): the steps after it again
    assert re.match(
        r"RESUMED from step=(15|10) " if saving == "async" else "RESUMED from step=15 ", resumed.stdout
    )
    reference = _losses(tmp_path / "ref.jsonl")
    assert len(reference) == 30 and _losses(tmp_path / "resumed.jsonl") == reference


def _trained(record: Path) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Each step's trained ids over every rank (sorted: a multiset), and the world that trained it."""
    ids: dict[int, list[int]] = defaultdict(list)
    worlds: dict[int, int] = {}
    for path in record.glob("ids-*.jsonl"):
        for line in map(json.loads, path.read_text().splitlines()):
            ids[line["step"]] += line["ids"]
            worlds[line["step"]] = line["world"]
    return {step: sorted(every) for step, every in ids.items()}, worlds


def _params(record: Path) -> list[torch.Tensor]:
    return [torch.tensor(p) for p in json.loads((record / "params.json").read_text())]


@pytest.mark.timeout(420)
def test_a_run_shrunk_to_2_ranks_and_grown_back_to_4_trains_the_uninterrupted_samples_every_step(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path)
    for name in ("uninterrupted", "elastic"):
        (tmp_path / name).mkdir()
    example = "ftrain.examples.elastic"
    done = _run(
        _torchrun(4, example, "--location", "u", "--steps", "12", "--record", "uninterrupted"), env, tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for nproc, steps in ((4, 4), (2, 8), (4, 12)):  # saved at 4 by 4 ranks, at 8 by 2
        part = _run(_torchrun(nproc, example, "--location", "e", "--steps", str(steps), "--record", "elastic"), env,
                    tmp_path)  # fmt: skip
        assert part.returncode == 0, part.stderr[-3000:]
    expected, _ = _trained(tmp_path / "uninterrupted")
    trained, worlds = _trained(tmp_path / "elastic")
    assert [worlds[s] for s in range(1, 13)] == [4] * 4 + [2] * 4 + [4] * 4
    assert trained == expected and all(len(ids) == 32 for ids in trained.values())
    seen = [i for step in range(1, 13) for i in trained[step]]
    assert len(set(seen)) == len(seen) == 12 * 32  # an epoch is 16 steps: no sample seen twice, none skipped
    difference = max(
        (a - b).abs().max().item()
        for a, b in zip(_params(tmp_path / "elastic"), _params(tmp_path / "uninterrupted"), strict=True)
    )
    assert difference <= TOLERANCE


WORLD_CHANGE = (
    "step 5 was saved by 1 rank and this start has 2: the loader StatefulDataLoader keeps a per-rank position, "
    "so samples would be skipped or seen twice"
)
"""What both world-change tests expect said: the refusal and the warning's detail begin with it."""
REFUSED = (
    f"{WORLD_CHANGE}; resume on 1 rank, or give the loader a global data position "
    "(ftrain.train.sampler.GlobalSampler as its batch_sampler), or pass world_change='warn' to go on anyway"
)
WARNED = f"{WORLD_CHANGE}; going on, as world_change='warn' asks"


def _per_rank_loader_saved_on_1_then_resumed_on_2(
    tmp_path: Path, world_change: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """A `StatefulDataLoader` job saved at step 5 on 1 rank (losses.jsonl), then the 2-rank job resuming it
    (`env` added to its environment)."""
    job = ["--loader", "stateful", "--location", "run", "--losses", "losses.jsonl"]
    saved = _run(
        [sys.executable, "-m", "tests.support.loader_job", *job, "--steps", "5"], _env(tmp_path), tmp_path
    )
    assert saved.returncode == 0, saved.stderr[-2000:]
    return _run(
        _torchrun(2, "tests.support.loader_job", *job, "--world-change", world_change),
        _env(tmp_path, **env),
        tmp_path,
    )


@pytest.mark.timeout(240)
def test_a_per_rank_loader_resumed_on_another_world_is_refused_before_training(tmp_path: Path) -> None:
    refused = _per_rank_loader_saved_on_1_then_resumed_on_2(tmp_path, "refuse")
    assert refused.returncode != 0
    assert f"loader_job: {REFUSED}\n" in refused.stderr, refused.stderr[-3000:]
    assert max(_losses(tmp_path / "losses.jsonl")) == 5  # nothing trained after the refusal


@pytest.mark.timeout(240)
def test_a_per_rank_loader_resumed_on_another_world_with_warn_goes_on_after_one_warning(
    tmp_path: Path,
) -> None:
    # every rank's warnings on stderr, as JSON: said once is the manager's doing, not the default's rank-0 filter
    resumed = _per_rank_loader_saved_on_1_then_resumed_on_2(tmp_path, "warn", FTRAIN_LOG_LEVEL="warning")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = [json.loads(line) for line in resumed.stderr.splitlines() if line.startswith("{")]
    said = [(e["event"], e.get("detail")) for e in events if e["event"] == "world_changed_data_per_rank"]
    assert said == [("world_changed_data_per_rank", WARNED)], resumed.stderr[-3000:]
    assert [e["event"] for e in events].count("world_size_changed") == 2  # each rank's warnings are shown
    assert "RESUMED from step=5 (epoch=0), saved by 1 rank, resumed by 2\n" in resumed.stdout
    steps = Counter(
        line["step"] for line in map(json.loads, (tmp_path / "losses.jsonl").read_text().splitlines())
    )
    assert steps == {**dict.fromkeys(range(1, 6), 1), **dict.fromkeys(range(6, 31), 2)}  # each rank on to 30
