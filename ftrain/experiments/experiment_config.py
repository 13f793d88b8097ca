"""The restart-cost experiment's settings and records: presets, the failure to inject, `config.json` and
`kills.json`.

The driver (`scripts/restart_experiment.py`) writes these files and the analysis reads them back, so their
schema lives here, once. Nothing here imports torch or touches a process.
"""

import itertools
from pathlib import Path
from typing import Final, Literal

import msgspec

from ftrain.settings import KILL_POINTS


class PhaseKind(msgspec.Struct, frozen=True, kw_only=True):
    """How a phase runs the one configuration: its checkpointing, and whether it gets the failures."""

    failures: bool = True
    async_ckpt: bool = False
    memory_tier: bool = False
    """Memory snapshots every `memory_every` steps beside the durable checkpoints (`--memory-every`)."""


PHASE_KINDS: Final = {
    "baseline": PhaseKind(failures=False),
    "sync": PhaseKind(),
    "async": PhaseKind(async_ckpt=True),
    "memory": PhaseKind(memory_tier=True),
}
"""Baseline: sync checkpointing, no failures. Then the same job with the same failures: sync, async, and
sync with the memory tier."""
PHASES: Final = tuple(PHASE_KINDS)
SAVE_POINTS: Final = tuple(p for p in KILL_POINTS if p != "step" and not p.startswith("snapshot"))
"""The points of a durable save (a memory snapshot's belong to no phase's saves)."""
SYNC_POINT: Final = {
    "stage": "write",
    "write": "write",
    "fanout": "write",
    "finalize": "finalize",
    "sealed": "sealed",
}
"""A sync save has no stage and no fan-out (it writes straight to durable storage): a kill meant for those
stages lands when its shards are written, the nearest point a sync save has."""
CONFIG: Final = "config.json"
KILLS: Final = "kills.json"
DEFAULT_KILLS: Final = 3


class Injection(msgspec.Struct, frozen=True, kw_only=True):
    """Which failures a phase with failures gets, and who delivers them.

    `time`: the driver SIGKILLs the job every `every_seconds` after the first complete checkpoint, `kills`
    times. `steps`: the driver SIGKILLs it when the newest complete checkpoint reaches each of `steps`.
    `save`: the trainer kills itself at `point` of the save of each of `steps` (FTRAIN_KILL_AT).
    """

    kind: Literal["time", "steps", "save"]
    steps: tuple[int, ...] = ()
    every_seconds: float | None = None
    kills: int = DEFAULT_KILLS
    point: str | None = None

    def describe(self) -> str:
        """One line for the report."""
        if self.kind == "time":
            return f"time-based: SIGKILL every {self.every_seconds:g} s after the first complete checkpoint, {self.kills}×"
        gates = ", ".join(map(str, self.steps))
        if self.kind == "steps":
            return f"step-gated: SIGKILL when the newest complete checkpoint reaches {gates}"
        return f"during save: SIGKILL at the {self.point} stage of the saves of steps {gates}"

    def save_kills(self, async_ckpt: bool) -> tuple[str, ...]:
        """The trainer's own kills in a phase, `<point>:<step>` in order (none unless `kind` is `save`)."""
        if self.kind != "save" or self.point is None:
            return ()
        point = self.point if async_ckpt else SYNC_POINT[self.point]
        return tuple(f"{point}:{step}" for step in self.steps)

    def kill_at(self, async_ckpt: bool) -> str | None:
        """The trainer's FTRAIN_KILL_AT for a phase (None: the driver delivers the kills, or there are none)."""
        return ",".join(self.save_kills(async_ckpt)) or None


def parse_injection(text: str) -> Injection:
    """`time:SECONDS[:KILLS]`, `steps:K1:K2:…` or `save:POINT:K1:K2:…`; ValueError naming the forms."""
    kind, *parts = text.split(":")
    forms = "use time:SECONDS[:KILLS], steps:K1:K2:K3 or save:POINT:K1:K2:K3"
    try:
        if kind == "time" and 1 <= len(parts) <= 2:
            every, kills = float(parts[0]), int(parts[1]) if len(parts) == 2 else DEFAULT_KILLS
            if every > 0 and kills > 0:
                return Injection(kind="time", every_seconds=every, kills=kills)
        elif kind == "steps" and parts:
            return _gated(Injection(kind="steps", steps=tuple(map(int, parts)), kills=len(parts)))
        elif kind == "save" and len(parts) >= 2 and parts[0] in SAVE_POINTS:
            steps = tuple(map(int, parts[1:]))
            return _gated(Injection(kind="save", point=parts[0], steps=steps, kills=len(steps)))
    except ValueError:
        pass
    raise ValueError(f"--inject {text!r}: {forms} (POINT one of {', '.join(SAVE_POINTS)})")


def _gated(injection: Injection) -> Injection:
    steps = injection.steps
    if not steps or steps[0] < 1 or any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError("kill steps must be positive and increasing")
    return injection


class Preset(msgspec.Struct, frozen=True, kw_only=True):
    """A ready-made configuration of the reference trainer."""

    model: str
    train_iters: int
    save_interval: int
    inject: str
    memory_every: int
    """Steps between the memory phase's snapshots: small against `save_interval`."""
    backoff: float = 0.0


PRESETS: Final = {
    # the debug model: all three phases in about three minutes on two CPU cores
    "quick": Preset(
        model="debug", train_iters=300, save_interval=10, inject="steps:60:120:180", memory_every=2
    ),
    # model + AdamW ≈ 1 GB of checkpoint state: about 2.3 s a step here, 15 minutes for the three phases;
    # four saves between kills, so most saves are not an attempt's first (which allocates the stage buffers)
    "standard": Preset(
        model="85m", train_iters=100, save_interval=5, inject="steps:30:50:70", memory_every=1
    ),
}


class ExperimentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """`config.json`: everything the phases were run with (`run_ids` names the phases run: an experiment
    from before the memory phase has none)."""

    preset: str
    model: str
    train_iters: int
    save_interval: int
    nproc: int
    seed: int
    backoff: float
    max_retries: int
    injection: Injection
    run_ids: dict[str, str]
    log: str
    """Where the events went: `embedded` (FTRAIN_HOME=<experiment>/home) or the FTRAIN_NATS_URL used."""
    started: str
    memory_every: int | None = None
    """The memory phase's steps between snapshots (None: an experiment from before that phase)."""

    @property
    def phases(self) -> list[str]:
        """The phases run, in order: those `run_ids` names (an older experiment ran fewer)."""
        return [phase for phase in PHASES if phase in self.run_ids]

    @property
    def embedded(self) -> bool:
        """Whether the experiment's own embedded server holds the log."""
        return self.log == "embedded"


class Kill(msgspec.Struct, frozen=True, kw_only=True):
    """One end of an attempt by a failure, as the driver saw it: when, by whom, and which checkpoints were
    complete (marker present) once every process of the job was dead, newest first."""

    phase: str
    time: float
    """Unix seconds: when the driver sent SIGKILL, or saw the job dead (kills from inside the trainer)."""
    by: Literal["driver", "trainer", "unexpected"]
    trigger: str
    complete_steps: tuple[int, ...]
    snapshot_steps: tuple[int, ...] = ()
    """The memory snapshots every rank had sealed in node memory at the kill, newest first (the memory
    phase; a resume may load one the log recorded)."""

    @property
    def newest_complete(self) -> int | None:
        """The newest checkpoint with a completion marker at the kill."""
        return self.complete_steps[0] if self.complete_steps else None


def write_json(path: Path, value: object) -> None:
    """Write a config or kill list, indented for people."""
    path.write_bytes(msgspec.json.format(msgspec.json.encode(value)) + b"\n")


def read_config(directory: Path) -> ExperimentConfig:
    """The experiment's `config.json`."""
    return msgspec.json.decode((directory / CONFIG).read_bytes(), type=ExperimentConfig)


def read_kills(directory: Path) -> list[Kill]:
    """The experiment's `kills.json` (empty before the first kill)."""
    path = directory / KILLS
    return msgspec.json.decode(path.read_bytes(), type=list[Kill]) if path.exists() else []
