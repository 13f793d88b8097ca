"""What the restart-cost analysis produces: per failure, per phase, the overheads, the whole experiment."""

import msgspec

from ftrain.experiments.goodput_check import GoodputCheck


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """One failure and its resume. Times are seconds since the phase's first step began."""

    index: int
    trigger: str
    kill_at: float
    newest_complete: int | None
    """The newest checkpoint complete at the kill (and not set aside), or memory snapshot sealed at it and
    recorded before the resume, if newer: where the resume must start."""
    resume_step: int
    reached_step: int | None
    lost_steps: int | None
    restart_seconds: float | None
    first_step_seconds: float | None
    """`train/dt` of the first step after the resume, which `restart_seconds` includes."""
    resumed_at: float | None
    """When the first step after the resume ended."""
    relaunch_seconds: float | None
    recompute_seconds: float | None
    tier: str = "durable"
    """The tier the resume loaded from: `durable`, or `memory` (`peer`) as its `resumed` event names it."""


class Stall(msgspec.Struct, frozen=True, kw_only=True):
    """Save stalls: per-save medians with their count, the memory snapshots' median with theirs, and the
    total the phase spent stalled."""

    saves: int
    median_save: float | None
    median_stage: float | None
    median_drain: float | None
    median_total: float | None
    total: float
    snapshots: int = 0
    """Memory snapshots staged (or skipped after agreeing): each holds the loop a little too."""
    median_snapshot: float | None = None


class PhaseResult(msgspec.Struct, frozen=True, kw_only=True):
    """One phase, analysed."""

    phase: str
    run_id: str
    async_ckpt: bool
    save_interval: int | None
    completed: bool
    wall_seconds: float | None
    """Training wall-clock: from the first step's start to rank 0's last line (the final save or drain
    included). The first start-up is left out: it is the same work in every phase, and the coldest in the
    first phase to run."""
    launch_to_completed: float | None
    final_step: int | None
    digest: str | None
    failures: list[Failure]
    stall: Stall
    step_seconds: float | None
    steps_total: float
    """`train/dt` summed over the steps that count: every step line but those a failure threw away."""
    copy_window_steps: int
    """Async: the most steps trained between a save and its checkpoint becoming complete."""
    curve: list[tuple[float, int]]
    """(seconds since the first step began, step) of rank 0's every step."""
    problems: list[str]
    goodput: GoodputCheck | None = None
    """The goodput `ftrain cost --run` derives from the log, beside the same terms from the metrics."""
    memory_every: int | None = None
    """Steps between memory snapshots (the memory tier); None: none taken."""
    snapshot_window_steps: int = 0
    """Memory tier: the most steps trained between a snapshot's step and its `snapshotted` event."""

    @property
    def lost_bound(self) -> int | None:
        """The most steps a failure may cost: with the memory tier, its cadence plus the snapshot window;
        otherwise the save interval, plus the copy window when async."""
        if self.memory_every is not None:
            return self.memory_every + self.snapshot_window_steps
        return None if self.save_interval is None else self.save_interval + self.copy_window_steps

    @property
    def kind(self) -> str:
        """How it checkpoints: `sync`, `async`, `sync + memory every 2`."""
        kind = "async" if self.async_ckpt else "sync"
        return kind if self.memory_every is None else f"{kind} + memory every {self.memory_every}"


class Overhead(msgspec.Struct, frozen=True, kw_only=True):
    """A phase's extra wall-clock over the baseline, and the parts that account for it (sums, seconds)."""

    phase: str
    failures: int
    overhead: float
    relaunch: float
    restart: float
    recompute: float
    stall_delta: float
    step_delta: float

    @property
    def explained(self) -> float:
        """Relaunch + restart (less its first step, counted with the steps) + recomputation + the changes in
        save stall and step time."""
        return self.relaunch + self.restart + self.recompute + self.stall_delta + self.step_delta

    @property
    def residual(self) -> float:
        """What the parts leave unexplained: the rest of the time between the lines (logging, the log's own
        work), and whatever a kill cut short before its line was written."""
        return self.overhead - self.explained


class ExperimentResult(msgspec.Struct, frozen=True, kw_only=True):
    """The whole experiment: phases in order (the first is the baseline), overheads, the digest verdict."""

    title: str
    notes: list[str]
    phases: list[PhaseResult]
    overheads: list[Overhead]
    problems: list[str]

    @property
    def digests_equal(self) -> bool:
        """Whether every phase ended with the baseline's parameters."""
        digests = {p.digest for p in self.phases}
        return len(digests) == 1 and None not in digests
