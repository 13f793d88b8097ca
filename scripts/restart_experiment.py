"""The restart-cost experiment: what a failure costs the reference trainer, measured, drawn and reported.

    .venv/bin/python scripts/restart_experiment.py [--preset quick|standard] [--inject SPEC] [--out DIR]

Four phases of one configuration, each a run supervised by `ftrain run --max-retries`, so every failure and
every resume is in the event log: `baseline` (sync checkpoints, no failures), then the same job with the same
failures: `sync`, `async`, and `memory` (sync checkpoints and the memory tier: a snapshot to node-local memory
every `--memory-every` steps, in a private directory of its own removed after it). Failures, one kind per
experiment (`--inject`):

- `time:SECONDS[:KILLS]`: SIGKILL every SECONDS after the first complete checkpoint (default 3 kills);
- `steps:K1:K2:K3`: SIGKILL when the newest complete checkpoint reaches each of K1, K2, K3;
- `save:POINT:K1:K2:K3`: the trainer kills itself at POINT (stage, write, fanout, finalize) of the saves of
  steps K1, K2, K3 (FTRAIN_KILL_AT; a sync save has no stage or fan-out: those land at `write`).

A kill is SIGKILL to torchrun's agent and every rank, as a preemption would be; the supervisor records
`failed` and relaunches, the trainer resumes by itself. The driver delivers time and step kills from outside
(never to the supervisor), once the newest checkpoint is complete, recorded in the log, and the job is
training past its save; in the memory phase, once a memory snapshot newer than that checkpoint is too (a kill
right after a durable save would leave the memory tier nothing to serve). It records each kill with the
checkpoints and snapshots complete once the job was dead.

Writes DIR (default `experiments/restart-<time>`): `config.json`, `kills.json`, per phase `run.log` (the
supervisor's output), `run.err`, `ckpt/<run id>/`, `metrics/`, and at the end `restart_plot.png` and
`restart_report.md` (`scripts/plot_restart.py DIR` renders them again). The log is an embedded server under
DIR/home unless FTRAIN_NATS_URL is set. Exit 0 when every phase completed and every cross-check holds.
"""

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ftrain import settings
from ftrain.errors import UsageError
from ftrain.events.redact import redact_url
from ftrain.experiments.experiment_config import (
    CONFIG,
    KILLS,
    PHASE_KINDS,
    PHASES,
    PRESETS,
    ExperimentConfig,
    Injection,
    Kill,
    parse_injection,
    write_json,
)
from ftrain.experiments.inputs import RUN_LOG, analyze_directory, opened
from ftrain.experiments.plot import publish
from ftrain.experiments.schedule import KillSchedule
from ftrain.host.job_signals import children, signal_job
from ftrain.logs import configure as configure_logging
from ftrain.service import RunService
from ftrain.train.metrics import decode_record, metrics_path
from ftrain.workers.layout import MARKER, complete_steps, parse_step, run_dir

POLL_S = 0.05
TAIL_BYTES = 4096
DEATH_WAIT_S = 30.0
SPARE_RETRIES = 2
"""Relaunches allowed beyond the planned kills, so an unplanned failure is measured, not fatal."""


def say(line: str) -> None:
    """Progress for the person running the experiment."""
    print(line, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--inject", help="time:SECONDS[:KILLS] | steps:K1:K2:K3 | save:POINT:K1:K2:K3")
    p.add_argument("--out", type=Path, help="experiment directory (default experiments/restart-<time>)")
    p.add_argument("--model", help="override the preset's model (debug, 85m)")
    p.add_argument("--train-iters", type=int)
    p.add_argument("--save-interval", type=int)
    p.add_argument("--memory-every", type=int, help="the memory phase's steps between snapshots")
    p.add_argument("--backoff", type=float, help="the supervisor's first relaunch wait (default 0)")
    p.add_argument("--nproc", type=int, default=2, help="training processes (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phases", default=",".join(PHASES), help=f"which to run (default {','.join(PHASES)})")
    return p.parse_args(argv)


def chosen_phases(text: str) -> list[str]:
    """`--phases`: the baseline and any of the others, run in their usual order; ValueError otherwise."""
    names = set(text.split(","))
    if "baseline" not in names or not names <= set(PHASES) or len(names) < 2:
        raise ValueError(f"--phases {text}: baseline and one or more of {', '.join(PHASES[1:])}")
    return [phase for phase in PHASES if phase in names]


def build_config(args: argparse.Namespace, stamp: str, log: str) -> ExperimentConfig:
    """The preset with the command line's overrides; ValueError on a bad injection."""
    preset = PRESETS[args.preset]
    injection = parse_injection(args.inject or preset.inject)
    memory_every = args.memory_every or preset.memory_every
    if memory_every < 1:
        raise ValueError(f"--memory-every {memory_every}: a positive number of steps")
    return ExperimentConfig(
        preset=args.preset,
        model=args.model or preset.model,
        train_iters=args.train_iters or preset.train_iters,
        save_interval=args.save_interval or preset.save_interval,
        nproc=args.nproc,
        seed=args.seed,
        backoff=preset.backoff if args.backoff is None else args.backoff,
        max_retries=injection.kills + SPARE_RETRIES,
        injection=injection,
        run_ids={phase: f"restart-{stamp}-{phase}" for phase in chosen_phases(args.phases)},
        log=log,
        started=stamp,
        memory_every=memory_every,
    )


# -- the job's processes -------------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def agent_of(supervisor: int) -> int | None:
    """The supervisor's running torchrun (the job's agent), if an attempt is running."""
    for pid in children(supervisor):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if alive(pid) and (b"torchrun" in argv or b"torch.distributed.run" in argv):
            return pid
    return None


def sealed_snapshots(memory: Path, ranks: int) -> list[int]:
    """The steps of the memory snapshots every rank has sealed under a phase's memory directory, newest first
    (the phase's own directory holds one job's: `ftrain-<uid>/<job>/step-<N>/rank-<r>/`)."""
    steps = {
        step
        for path in memory.glob("ftrain-*/*/step-*")
        if (step := parse_step(path.name)) is not None
        and all((path / f"rank-{rank}" / MARKER).exists() for rank in range(ranks))
    }
    return sorted(steps, reverse=True)


def kill_job(agent: int) -> None:
    """SIGKILL the agent and every rank, as a preemption would, and wait until all of them are dead."""
    pids = [agent, *children(agent)]
    signal_job(agent, signal.SIGKILL)
    deadline = time.monotonic() + DEATH_WAIT_S
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def training_past(metrics: Path, step: int) -> bool:
    """Whether rank 0 is training beyond the save of `step`: its last metrics line is that save's, or a later
    step's or save's (a sync save returns only once its checkpoint is sealed, recorded and pruned)."""
    try:
        with metrics.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return False
    last = next((r for line in reversed(lines) if (r := decode_record(line)) is not None), None)
    return (
        last is not None
        and last.iter is not None
        and (last.iter > step or (last.iter == step and last.is_save))
    )


# -- one phase -----------------------------------------------------------------------------------------------


class Watch:
    """Follows one phase's attempts: delivers the driver's kills and records how each failed attempt ended."""

    def __init__(
        self,
        app: RunService,
        phase: str,
        run_id: str,
        phase_dir: Path,
        injection: Injection | None,
        config: ExperimentConfig,
        memory: Path | None,
    ) -> None:
        self.app, self.phase, self.run_id = app, phase, run_id
        self.ckpt_dir = run_dir(phase_dir / "ckpt", run_id)
        self.metrics = metrics_path(phase_dir / "metrics", 0)
        self.injection = injection
        copy = "memory snapshot" if memory is not None else "checkpoint"
        self.schedule = KillSchedule(injection, config.train_iters, copy) if injection else None
        self.memory, self.ranks = memory, config.nproc
        self._snapshot: int | None = None  # the newest snapshot the log held when last asked
        self.kills: list[Kill] = []
        self._recorded: set[int] = set()
        self._ended: Kill | None = None  # an attempt that died by itself, a failure once it is relaunched
        self._trainer_kills = 0

    async def settled(self) -> int | None:
        """The newest checkpoint complete on disk, recorded in the log, and with training going on past its
        save (None while one is in between): a kill inside a save is the `save:` injection's business. With
        the memory tier, the newest snapshot newer than it, sealed, recorded and trained past."""
        durable = await self._settled_checkpoint()
        if durable is None or self.memory is None:
            return durable
        return await self._settled_snapshot(durable)

    async def _settled_checkpoint(self) -> int | None:
        steps = complete_steps(self.ckpt_dir)
        if not steps or not training_past(self.metrics, steps[0]):
            return None
        if steps[0] not in self._recorded:
            try:
                state = await self.app.state_of(self.run_id)
            except UsageError:  # not launched yet
                return None
            self._recorded = {c.step for c in state.checkpoints}
        return steps[0] if steps[0] in self._recorded else None

    async def _settled_snapshot(self, durable: int) -> int | None:
        """None until a snapshot newer than the checkpoint `durable` is sealed by every rank, recorded in the
        log and trained past: the failure the memory tier is for lands between durable saves."""
        assert self.memory is not None
        sealed = sealed_snapshots(self.memory, self.ranks)
        if not sealed or sealed[0] <= durable or not training_past(self.metrics, sealed[0]):
            return None
        if self._snapshot != sealed[0]:
            snapshot = (await self.app.state_of(self.run_id)).snapshot
            self._snapshot = snapshot.recorded.step if snapshot is not None else None
        return sealed[0] if self._snapshot == sealed[0] else None

    def _record(self, by: Literal["driver", "trainer", "unexpected"], trigger: str, when: float) -> Kill:
        """A kill record, with the checkpoints complete now that the job is dead."""
        steps = tuple(complete_steps(self.ckpt_dir))
        snapshots = tuple(sealed_snapshots(self.memory, self.ranks)) if self.memory else ()
        return Kill(
            phase=self.phase,
            time=when,
            by=by,
            trigger=trigger,
            complete_steps=steps,
            snapshot_steps=snapshots,
        )

    def _died(self) -> None:
        """The attempt ended without the driver: a trainer's own kill (FTRAIN_KILL_AT), a crash, or success."""
        async_ckpt = PHASE_KINDS[self.phase].async_ckpt
        planned = self.injection.save_kills(async_ckpt) if self.injection else ()
        if self._trainer_kills < len(planned):
            self._ended = self._record(
                "trainer", f"FTRAIN_KILL_AT {planned[self._trainer_kills]}", time.time()
            )
        else:
            self._ended = self._record("unexpected", "the job died on its own", time.time())

    def _relaunched(self) -> None:
        """A new attempt started: the previous one's end was a failure."""
        ended, self._ended = self._ended, None
        if ended is not None:
            self.kills.append(ended)
            self._trainer_kills += ended.by == "trainer"
            say(f"  {self.phase}: attempt ended ({ended.trigger}); newest complete {ended.newest_complete}")

    async def follow(self, supervisor: asyncio.subprocess.Process) -> None:
        """Until the supervisor exits."""
        watched: int | None = None
        while supervisor.returncode is None:
            if watched is not None and not alive(watched):
                self._died()
                watched = None
            if watched is None and (watched := agent_of(supervisor.pid)) is not None:
                self._relaunched()
            if watched is not None and self.schedule is not None:
                newest = await self.settled()
                trigger = self.schedule.due(time.time(), newest)
                if trigger is not None and newest is not None:
                    when = time.time()
                    await asyncio.to_thread(kill_job, watched)
                    kill = self._record("driver", trigger, when)
                    self.kills.append(kill)
                    self.schedule.fired_at(newest)
                    newest_copies = f"{kill.newest_complete}" + (
                        f", newest snapshot {kill.snapshot_steps[0]}" if kill.snapshot_steps else ""
                    )
                    say(f"  {self.phase}: SIGKILL ({trigger}); newest complete {newest_copies}")
                    watched = None
            await asyncio.sleep(POLL_S)
        if supervisor.returncode != 0 and self._ended is not None:
            self.kills.append(self._ended)  # the last attempt failed and the supervisor gave up


def stage_dir(run_id: str) -> Path:
    """The async phase's node-local staging directory (the trainer's default place), removed after it."""
    return Path(tempfile.gettempdir()) / f"ftrain-ckpt-{run_id}"


def memory_dir(run_id: str, env: dict[str, str]) -> Path:
    """A memory phase's own node-local memory: a new private (0700) directory under FTRAIN_MEMORY_DIR's
    place (a tmpfs, /dev/shm by default), so no other job's snapshots mix with its; removed after it."""
    return Path(tempfile.mkdtemp(prefix=f"ftrain-{run_id}-", dir=settings.memory_dir(env)))


def train_command(config: ExperimentConfig, phase_dir: Path, phase: str, run_id: str) -> list[str]:
    """The reference trainer's command line for a phase."""
    kind = PHASE_KINDS[phase]
    argv = ["-m", "ftrain.examples.train", "--model", config.model, "--train-iters", str(config.train_iters),
            "--save-interval", str(config.save_interval), "--seed", str(config.seed),
            "--metrics-dir", str(phase_dir / "metrics")]  # fmt: skip
    if kind.async_ckpt:
        argv += ["--async-ckpt", "--ckpt-stage-dir", str(stage_dir(run_id))]
    if kind.memory_tier and config.memory_every is not None:
        argv += ["--memory-every", str(config.memory_every)]
    return argv


async def run_phase(
    app: RunService, config: ExperimentConfig, out: Path, phase: str, env: dict[str, str]
) -> list[Kill]:
    """Supervise one phase to its end; returns its kills."""
    phase_dir = out / phase
    phase_dir.mkdir(parents=True)
    run_id, kind = config.run_ids[phase], PHASE_KINDS[phase]
    async_ckpt = kind.async_ckpt
    injection = config.injection if kind.failures else None
    job_env = {**env, settings.STORAGE: str(phase_dir / "ckpt"), "PYTHONUNBUFFERED": "1"}
    job_env.setdefault("OMP_NUM_THREADS", "1")
    for variable in (settings.KILL_AT, settings.MEMORY_EVERY, settings.MEMORY_DIR):
        job_env.pop(variable, None)  # the phase decides: the command line's --memory-every, its own directory
    memory = memory_dir(run_id, env) if kind.memory_tier else None
    if memory is not None:
        job_env[settings.MEMORY_DIR] = str(memory)
    if injection is not None and (kill_at := injection.kill_at(async_ckpt)):
        job_env.update({settings.KILL_AT: kill_at, settings.KILL_ONCE: str(phase_dir / "kill-once")})
    argv = [str(Path(sys.executable).with_name("ftrain")), "run", "restart", "--nodes", "1",
            "--gpus-per-node", str(config.nproc), "--nodelist", "localhost", "--run-id", run_id,
            "--max-retries", str(config.max_retries), "--backoff", f"{config.backoff:g}",
            "--", *train_command(config, phase_dir, phase, run_id)]  # fmt: skip
    say(f"{phase}: {run_id} ({'async' if async_ckpt else 'sync'} checkpoints"
        f"{f', memory every {config.memory_every}' if memory else ''})")  # fmt: skip
    watch = Watch(app, phase, run_id, phase_dir, injection, config, memory)
    started = time.monotonic()
    with (phase_dir / RUN_LOG).open("wb") as stdout, (phase_dir / "run.err").open("wb") as stderr:
        supervisor = await asyncio.create_subprocess_exec(*argv, env=job_env, stdout=stdout, stderr=stderr)
        try:
            await watch.follow(supervisor)
        finally:
            if supervisor.returncode is None:  # interrupted: the supervisor stops the job and records it
                supervisor.terminate()
                await supervisor.wait()
            shutil.rmtree(stage_dir(run_id), ignore_errors=True)
            if memory is not None:
                shutil.rmtree(memory, ignore_errors=True)
    say(
        f"{phase}: exit {supervisor.returncode} after {time.monotonic() - started:.1f} s, {len(watch.kills)} failure(s)"
    )
    return watch.kills


async def experiment(config: ExperimentConfig, out: Path, env: dict[str, str]) -> int:
    """Run the phases, then analyse, draw and report; 0 when every phase completed and every check holds."""
    kills: list[Kill] = []
    async with opened(env) as app:  # an embedded server starts here, as ours, not a supervisor's child
        for phase in config.phases:
            kills += await run_phase(app, config, out, phase, env)
            write_json(out / KILLS, kills)
        result = await analyze_directory(out, env)
    plot, report = publish(result, out)
    say(f"plot:   {plot}\nreport: {report}")
    for problem in result.problems:
        say(f"MISMATCH {problem}")
    return 0 if all(p.completed for p in result.phases) and not result.problems else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (args.out or Path("experiments") / f"restart-{stamp}").absolute()
    if (out / CONFIG).exists():
        print(f"restart_experiment: {out} already holds an experiment", file=sys.stderr)
        return 2
    env = dict(os.environ)
    try:
        configure_logging()
        url = settings.nats(env).url
        if url is None:
            env.update({settings.HOME: str(out / "home"), settings.NATS_URL: ""})
        config = build_config(args, stamp, redact_url(url) if url else "embedded")
        settings.memory_dir(env)  # the memory phase's directory goes there: a bad one is refused now
    except ValueError as exc:
        print(f"restart_experiment: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / CONFIG, config)
    say(f"experiment {out}: preset {config.preset}, model {config.model}, {config.train_iters} steps, save every "
        f"{config.save_interval}, memory phase snapshots every {config.memory_every}; "
        f"{config.injection.describe()}")  # fmt: skip
    return asyncio.run(experiment(config, out, env))


if __name__ == "__main__":
    sys.exit(main())
