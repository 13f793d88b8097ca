"""Reading a restart-cost experiment back for analysis: an experiment directory (config, kills, each phase's
supervisor output and metrics) plus the event log, or bare run ids, from the log and the metrics alone.

The log says where each run kept its checkpoints and metrics (its `launched` event carries the storage root
and the trainer's command line), so a run analysed by id needs nothing else.
"""

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

from ftrain import settings
from ftrain.events.jetstream.nats_server import server_status, stop_server
from ftrain.events.schema import AnyEvent, Launched
from ftrain.experiments.analysis import analyze
from ftrain.experiments.experiment_config import ExperimentConfig, Kill, read_config, read_kills
from ftrain.experiments.readings import PhaseInput
from ftrain.experiments.results import ExperimentResult
from ftrain.service import RunService
from ftrain.train.metrics import metrics_path, read_records
from ftrain.workers.layout import run_dir, set_asides
from ftrain.workers.storage.location import uri_path

RUN_LOG: Final = "run.log"


def command_flag(command: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in a recorded command line (`--flag V` or `--flag=V`), or None."""
    for i, word in enumerate(command):
        if word == flag and i + 1 < len(command):
            return command[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def set_aside_steps(ckpt_dir: Path) -> list[int]:
    """Steps whose checkpoint the trainer set aside as sealed but never recorded."""
    return [s.step for s in set_asides(ckpt_dir) if s.kind == "unrecorded"]


async def run_events(app: RunService, run_id: str) -> tuple[list[AnyEvent], list[str]]:
    """The run's events as the chain walk folds them, and every break it found."""
    entries = await app.timeline(run_id)
    events = [e.event for e in entries if e.event is not None]
    return events, [e.finding.describe() for e in entries if e.finding is not None]


async def phase_input(
    app: RunService, phase: str, run_id: str, *, stdout: str | None, kills: list[Kill] | None
) -> PhaseInput:
    """One phase's inputs: the log's events, and rank 0's metrics where the trainer's command put them."""
    events, findings = await run_events(app, run_id)
    launched = next((e for e in events if isinstance(e, Launched)), None)
    if launched is None:
        raise LookupError(f"run {run_id}: no `launched` event in the log")
    ckpt_dir = run_dir(uri_path(launched.storage), run_id)
    metrics = command_flag(launched.command, "--metrics-dir")
    interval = command_flag(launched.command, "--save-interval")
    memory_every = command_flag(launched.command, "--memory-every")
    return PhaseInput(
        phase=phase,
        run_id=run_id,
        async_ckpt="--async-ckpt" in launched.command,
        save_interval=_steps(interval),
        events=events,
        findings=findings,
        records=read_records(metrics_path(Path(metrics) if metrics else ckpt_dir / "metrics", 0)),
        stdout=stdout,
        kills=kills,
        set_aside=set_aside_steps(ckpt_dir),
        memory_every=_steps(memory_every),
    )


def _steps(text: str | None) -> int | None:
    """A recorded positive count of steps (`--memory-every 0` turns the memory tier off), else None."""
    return int(text) if text and text.isdigit() and int(text) > 0 else None


def notes(config: ExperimentConfig) -> list[str]:
    """The configuration lines at the head of a report."""
    return [
        f"preset `{config.preset}`: model `{config.model}`, {config.train_iters} steps, a checkpoint every "
        f"{config.save_interval} steps, {config.nproc} ranks, seed {config.seed}",
        f"failures: {config.injection.describe()}; relaunch by `ftrain run --max-retries "
        f"{config.max_retries} --backoff {config.backoff:g}`",
        "baseline: sync checkpointing, no failures"
        + (
            ""
            if config.memory_every is None
            else f"; memory: sync, a memory snapshot every {config.memory_every} steps"
        )
        + "; run ids "
        + ", ".join(f"{phase} `{run_id}`" for phase, run_id in config.run_ids.items()),
    ]


def log_env(directory: Path, config: ExperimentConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The environment that reaches the experiment's log: its own embedded server, or the one it used."""
    if config.embedded:
        return {**env, settings.HOME: str(directory / "home"), settings.NATS_URL: ""}
    return {**env, settings.NATS_URL: config.log}


@asynccontextmanager
async def opened(env: Mapping[str, str]) -> AsyncIterator[RunService]:
    """The service over `env`'s log; an embedded server started for this is stopped afterwards."""
    nats = settings.nats(env)
    home = nats.home if nats.url is None else None
    started = home is not None and server_status(home) is None
    try:
        async with RunService.open(env) as app:
            yield app
    finally:
        if started and home is not None:
            stop_server(home)


async def analyze_directory(directory: Path, env: Mapping[str, str] = os.environ) -> ExperimentResult:
    """Analyse an experiment directory written by `scripts/restart_experiment.py`."""
    config = read_config(directory)
    kills = read_kills(directory)
    inputs = []
    async with opened(log_env(directory, config, env)) as app:
        for phase in config.phases:
            run_log = directory / phase / RUN_LOG
            inputs.append(
                await phase_input(
                    app,
                    phase,
                    config.run_ids[phase],
                    stdout=run_log.read_text(errors="replace") if run_log.exists() else None,
                    kills=[k for k in kills if k.phase == phase],
                )
            )
    return analyze(f"Restart-cost experiment `{directory.name}`", notes(config), inputs)


async def analyze_runs(run_ids: Mapping[str, str], env: Mapping[str, str] = os.environ) -> ExperimentResult:
    """Analyse runs by id (phase → run id, the baseline first) from the log and their metrics alone."""
    async with opened(env) as app:
        inputs = [await phase_input(app, p, r, stdout=None, kills=None) for p, r in run_ids.items()]
    listed = ", ".join(f"{phase} `{run_id}`" for phase, run_id in run_ids.items())
    return analyze(
        "Restart-cost report",
        [
            f"runs {listed}, read from the event log and their metrics",
            "no supervisor output or kill records: kill times are the `failed` events', and the checks "
            "against the kills, the `RESUMED` lines and the final digests are skipped",
        ],
        inputs,
    )
