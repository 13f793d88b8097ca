"""The restart-cost experiment end to end on its quick preset (debug model, two CPU ranks, a few minutes):
four phases under the supervisor, step-gated SIGKILLs to every rank, and a plot and report whose numbers are
checked here against the event log, the metrics and the supervisor's output, read independently; the memory
phase's resumes load from node memory, its private memory directory gone after it."""

import asyncio
import os
import re
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ftrain.events.jetstream.nats_server import stop_server
from ftrain.events.schema import AnyEvent, Checkpointed, Failed, Resumed, Snapshotted, event_type
from ftrain.experiments.experiment_config import PHASES, ExperimentConfig, Kill, read_config, read_kills
from ftrain.service import RunService
from tests.support.docs import blocks, commands
from tests.support.paths import ROOT
from tests.support.training import FINAL

pytestmark = pytest.mark.timeout(540)


@dataclass(frozen=True)
class Experiment:
    """One quick-preset experiment, with its log read back."""

    out: Path
    config: ExperimentConfig
    kills: list[Kill]
    events: dict[str, list[AnyEvent]]
    chains_ok: bool

    def run_events(self, phase: str) -> list[AnyEvent]:
        return self.events[self.config.run_ids[phase]]

    def metrics(self, phase: str) -> list[dict[str, Any]]:
        lines = (self.out / phase / "metrics" / "metrics-0.jsonl").read_bytes().splitlines()
        return [msgspec.json.decode(line) for line in lines]

    def stdout(self, phase: str) -> str:
        return (self.out / phase / "run.log").read_text()


def log_env(out: Path) -> dict[str, str]:
    """The experiment's own embedded log."""
    return {**os.environ, "FTRAIN_HOME": str(out / "home"), "FTRAIN_NATS_URL": ""}


async def read_log(out: Path, run_ids: list[str]) -> tuple[dict[str, list[AnyEvent]], bool]:
    async with RunService.open(log_env(out)) as app:
        events = {r: [e.event for e in await app.timeline(r) if e.event is not None] for r in run_ids}
        verified = [(await app.verify(r)).ok for r in run_ids]
    return events, all(verified)


def documented_quick_run() -> list[str]:
    """The quick preset's command as docs/restart-experiment.md shows it (its docs block is run here, not by
    tests/e2e/test_docs.py: the experiment takes minutes, and this test checks what it writes)."""
    page = blocks(ROOT / "docs" / "restart-experiment.md")
    shown = [command for block in page for command, _ in commands(block.body) if "--preset quick" in command]
    assert len(shown) == 1, shown
    return shlex.split(shown[0], comments=True)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Experiment:
    out = tmp_path_factory.mktemp("restart") / "quick"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTRAIN_")}
    argv = documented_quick_run()
    assert argv[:2] == [".venv/bin/python", "scripts/restart_experiment.py"], argv
    run = subprocess.run(
        [sys.executable, *argv[1:], "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=520,
    )  # fmt: skip
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr[-4000:]}"
    config = read_config(out)
    try:
        events, chains_ok = asyncio.run(read_log(out, list(config.run_ids.values())))
    finally:
        stop_server(out / "home")
    return Experiment(out, config, read_kills(out), events, chains_ok)


def test_each_kill_is_one_failed_and_one_resumed_from_the_newest_checkpoint_complete_at_it(
    experiment: Experiment,
) -> None:
    assert experiment.chains_ok
    baseline = experiment.run_events("baseline")
    assert [event_type(e) for e in baseline if not isinstance(e, Checkpointed)] == ["launched", "completed"]
    for phase in ("sync", "async", "memory"):
        kills = [k for k in experiment.kills if k.phase == phase]
        assert [k.by for k in kills] == ["driver"] * 3
        events = experiment.run_events(phase)
        lifecycle = [event_type(e) for e in events if not isinstance(e, (Checkpointed, Snapshotted))]
        opened = ["failed", "resumed"] if phase != "memory" else ["failed", "resumed", "resumed"]
        assert lifecycle == ["launched", *opened * 3, "completed"], phase
        failed = [e for e in events if isinstance(e, Failed)]
        assert all((f.reason, f.exit_code) == ("signal", 137) for f in failed)  # SIGKILL
        resumed = [e for e in events if isinstance(e, Resumed)]
        if phase == "memory":  # the relaunch opens from durable storage, its trainer loads memory's newer
            assert [r.step for r in resumed[0::2]] == [k.complete_steps[0] for k in kills] == [60, 120, 180]
            resumed = resumed[1::2]
            assert [r.tier for r in resumed] == ["memory"] * 3
            assert [r.step for r in resumed] == [k.snapshot_steps[0] for k in kills]
            assert all(60 < r.step < 70 or 120 < r.step < 130 or 180 < r.step < 190 for r in resumed)
        else:
            assert [r.step for r in resumed] == [k.complete_steps[0] for k in kills], phase
            assert [r.step for r in resumed] == [60, 120, 180]  # the gates: each kill came once complete
        restarts = [m for m in experiment.metrics(phase) if "train/restart_seconds" in m]
        assert [m["train/iter"] for m in restarts] == [r.step + 1 for r in resumed]
        lines = [int(s) for s in re.findall(r"^RESUMED from step=(\d+)", experiment.stdout(phase), re.M)]
        assert lines == [r.step for r in resumed]


def copy_window(metrics: list[dict[str, Any]], events: list[AnyEvent]) -> int:
    """The most steps rank 0 trained between an async save's stage and its checkpoint's `checkpointed`."""
    widest = 0
    for event in events:
        if not isinstance(event, Checkpointed):
            continue
        sealed = event.time.timestamp()
        staged = [
            m["time"]
            for m in metrics
            if m.get("train/iter") == event.step and "train/ckpt_stage_seconds" in m and m["time"] <= sealed
        ]
        if staged:
            trained = [
                m["train/iter"] for m in metrics if "train/loss" in m and max(staged) <= m["time"] <= sealed
            ]
            widest = max(widest, max(trained, default=event.step) - event.step)
    return widest


def test_lost_steps_stay_within_the_save_interval_plus_the_async_copy_window(experiment: Experiment) -> None:
    interval = experiment.config.save_interval
    for phase in ("sync", "async"):
        metrics = experiment.metrics(phase)
        window = copy_window(metrics, experiment.run_events(phase)) if phase == "async" else 0
        lost = [m["train/lost_steps"] for m in metrics if "train/lost_steps" in m]
        assert len(lost) == 3 and all(0 <= n <= interval + window for n in lost), (phase, lost, window)


def test_the_memory_phase_loses_at_most_memory_every_plus_the_snapshot_window_and_leaves_no_memory(
    experiment: Experiment,
) -> None:
    every = experiment.config.memory_every
    assert every is not None and every < experiment.config.save_interval
    snapshots = [e for e in experiment.run_events("memory") if isinstance(e, Snapshotted)]
    assert snapshots and all(e.step % every == 0 and e.train_seconds is not msgspec.UNSET for e in snapshots)
    lost = [m["train/lost_steps"] for m in experiment.metrics("memory") if "train/lost_steps" in m]
    report = (experiment.out / "restart_report.md").read_text()
    window = int(re.search(r"the snapshot window \((\d+) steps", report).group(1))  # type: ignore[union-attr]
    assert len(lost) == 3 and all(0 <= n <= every + window for n in lost), (lost, window)
    row = next(r for r in table_rows(report, "## Failures side by side") if r[0] == "memory")
    assert (row[3], row[4]) == ("memory 3", ", ".join(map(str, lost)))
    run_id = experiment.config.run_ids["memory"]
    assert not list(Path("/dev/shm").glob(f"ftrain-{run_id}-*")), "its memory directory is removed"


def test_every_phase_ends_with_the_baselines_parameters(experiment: Experiment) -> None:
    finals = {phase: FINAL.findall(experiment.stdout(phase)) for phase in PHASES}
    assert all(len(f) == 1 for f in finals.values()), finals
    assert {f[0] for f in finals.values()} == {(str(experiment.config.train_iters), finals["baseline"][0][1])}


def table_rows(report: str, heading: str) -> list[list[str]]:
    """The data rows of the first table after `heading`."""
    section = report.split(heading, 1)[1].split("\n#", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]


def test_the_plot_and_the_report_exist_and_their_numbers_are_the_logs(experiment: Experiment) -> None:
    png = (experiment.out / "restart_plot.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    report = (experiment.out / "restart_report.md").read_text()
    assert "MISMATCH" not in report and "No mismatch." in report
    for phase in ("sync", "async"):
        resumed = [e for e in experiment.run_events(phase) if isinstance(e, Resumed)]
        kills = [k for k in experiment.kills if k.phase == phase]
        restarts = [m for m in experiment.metrics(phase) if "train/restart_seconds" in m]
        rows = table_rows(report, f"### {phase} ")
        assert [(r[0], r[3], r[4], r[5], r[6]) for r in rows] == [
            (str(i), str(k.complete_steps[0]), str(e.step), str(m["train/lost_steps"]), f"{m['train/restart_seconds']:.2f}")
            for i, (k, e, m) in enumerate(zip(kills, resumed, restarts, strict=True), start=1)
        ]  # fmt: skip
    summary = {row[0]: row for row in table_rows(report, "## Summary")}
    saves = [
        m["train/ckpt_save_seconds"] for m in experiment.metrics("sync") if "train/ckpt_save_seconds" in m
    ]
    assert summary["sync"][7] == f"{statistics.median(saves):.3f} s (n={len(saves)})"
    digest = FINAL.findall(experiment.stdout("baseline"))[0][1]
    assert [summary[p][8] for p in PHASES] == [f"`{digest[:16]}…`"] * len(PHASES)
    assert [summary[p][9] for p in PHASES] == ["baseline", "true", "true", "true"]
    assert "Every phase's final parameters are equal to the baseline's." in report


def test_plot_restart_renders_the_same_report_from_the_directory_and_from_the_run_ids(
    experiment: Experiment, tmp_path: Path
) -> None:
    report = experiment.out / "restart_report.md"
    before = report.read_text()
    report.unlink()
    (experiment.out / "restart_plot.png").unlink()
    again = subprocess.run(
        [sys.executable, "scripts/plot_restart.py", str(experiment.out)],
        cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert report.read_text() == before
    assert (experiment.out / "restart_plot.png").stat().st_size > 20_000
    ids = experiment.config.run_ids
    by_id = subprocess.run(
        [sys.executable, "scripts/plot_restart.py", "--baseline", ids["baseline"], "--sync", ids["sync"],
         "--async", ids["async"], "--out", str(tmp_path)],
        cwd=ROOT, env=log_env(experiment.out), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert by_id.returncode == 0, by_id.stdout + by_id.stderr[-3000:]
    from_log = (tmp_path / "restart_report.md").read_text()
    assert table_rows(from_log, "### sync ")[0][4:7] == table_rows(before, "### sync ")[0][4:7]
    assert (tmp_path / "restart_plot.png").exists()


def test_kills_inside_saves_are_the_trainers_own_and_cost_one_interval(tmp_path: Path) -> None:
    """`save:` injection: the trainer kills itself mid-save (the sync phase at `write`, as it has no fan-out);
    the driver only sees each attempt die, and the resume comes from the checkpoint before the one cut short."""
    out = tmp_path / "during-save"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTRAIN_")}
    run = subprocess.run(
        [sys.executable, "scripts/restart_experiment.py", "--out", str(out), "--inject", "save:fanout:40:80",
         "--train-iters", "100", "--phases", "baseline,sync,async"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr[-4000:]}"
    kills = read_kills(out)
    assert [(k.phase, k.by, k.trigger, k.newest_complete) for k in kills] == [
        ("sync", "trainer", "FTRAIN_KILL_AT write:40", 30), ("sync", "trainer", "FTRAIN_KILL_AT write:80", 70),
        ("async", "trainer", "FTRAIN_KILL_AT fanout:40", 30), ("async", "trainer", "FTRAIN_KILL_AT fanout:80", 70),
    ]  # fmt: skip
    report = (out / "restart_report.md").read_text()
    assert "No mismatch." in report
    assert [(r[4], r[5]) for r in table_rows(report, "### sync ")] == [("30", "10"), ("70", "10")]
    assert [r[4] for r in table_rows(report, "### async ")] == ["30", "70"]
