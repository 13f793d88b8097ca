"""Which checkpoints a resume tries, in which order, and what it sets aside: one plan for `ftrain resume`
and for the trainer's automatic resume. Pure: the caller lists the storage and reads the log, executes the
plan (verifying, loading, recording), and each verdict is recorded through the deciders.
"""

from collections.abc import Sequence

import msgspec

from ftrain.domain.lifecycle.intents import FailIntent, ResumeIntent
from ftrain.domain.lifecycle.judge import IllegalTransition, check_may_resume, check_open
from ftrain.domain.lifecycle.run_state import CheckpointRef, RunState


class OnDisk(msgspec.Struct, frozen=True):
    """A step directory in the run's storage that carries a completion marker (not yet verified)."""

    step: int
    uri: str
    digest: str | None  # the manifest digest its marker claims; None when the marker is unreadable


class Candidate(msgspec.Struct, frozen=True):
    """A checkpoint to try, with the manifest digest it must have: the log's, or, with no log to ask, its
    own marker's. `ref` is the log's record of it (None without a log)."""

    step: int
    uri: str
    digest: str | None
    ref: CheckpointRef | None = None


class ResumePlan(msgspec.Struct, frozen=True):
    """What to do, in order: set aside `unrecorded` and `superseded`, try `candidates` newest first; when
    none verifies and `had_checkpoints`, stop (never start over); `restart` records a start from step 0.
    `retired`: the steps the log says retention deleted (one still on disk: its deletion was interrupted).
    `quarantined`: without a log, the steps an earlier start set aside as corrupt (the evidence that the run
    had checkpoints)."""

    candidates: tuple[Candidate, ...] = ()
    unrecorded: tuple[OnDisk, ...] = ()
    superseded: tuple[OnDisk, ...] = ()
    had_checkpoints: bool = False
    restart: bool = False
    retired: tuple[int, ...] = ()
    quarantined: tuple[str, ...] = ()

    def accepted(self, resumed: int | None) -> list[int]:
        """The steps retention counts once the plan resumed from step `resumed` (None: from nothing): the
        candidates from that one back (a newer one was refused and set aside). Only what the plan vouches
        for: a step sealed on disk that the log never recorded is no candidate, and never counted."""
        return [c.step for c in self.candidates if resumed is not None and c.step <= resumed]

    def attempt_after(self, current: int) -> int:
        """The attempt a start records in when the run is in attempt `current`: the next when the start
        resumes or restarts (which opens one), else `current`."""
        return current + (1 if self.candidates or self.restart else 0)


def plan_resume(
    state: RunState | None,
    on_disk: Sequence[OnDisk],
    *,
    forced: bool = False,
    fresh: bool = False,
    failed_in_place: bool = False,
    quarantined: Sequence[str] = (),
) -> ResumePlan:
    """The plan for a run in `state` (None: no log to ask) whose storage holds `on_disk`, and `quarantined`,
    the steps set aside there as corrupt.

    `forced`: resume a run the log still thinks is running. `fresh`: start over (`--no-resume`), legal only
    while the log knows no checkpoint; the directories on disk are superseded, never deleted.
    `failed_in_place`: the launcher restarted the workers itself, a failure the log is about to record.
    A complete directory newer than anything the log recorded was sealed but never recorded (killed between
    the two): nothing vouches for it, so it is set aside, not trusted.
    Without a log the storage is the only record: a run whose checkpoints were all set aside as corrupt had
    checkpoints, and stays refused on every later start until one starts over on purpose (`fresh`, which
    leaves the set-aside steps where they are). Raises IllegalTransition."""
    if state is None:
        if fresh:
            return ResumePlan(superseded=tuple(on_disk))
        candidates = tuple(Candidate(d.step, d.uri, d.digest) for d in on_disk)
        return ResumePlan(
            candidates, had_checkpoints=bool(candidates or quarantined), quarantined=tuple(quarantined)
        )
    check_open(state)
    failed = state.status == "failed" or failed_in_place
    if fresh:
        if state.checkpoints:
            raise IllegalTransition(f"run {state.run_id} has checkpoints; --no-resume needs a new --run-id")
        return ResumePlan(superseded=tuple(on_disk), restart=failed)
    check_may_resume(state, forced=forced or failed_in_place)
    known = {c.uri for c in state.checkpoints}
    newest = max((c.step for c in state.checkpoints), default=-1)
    valid = state.valid_checkpoints()
    return ResumePlan(
        candidates=tuple(Candidate(c.step, c.uri, c.checkpoint_hash, c) for c in valid),
        unrecorded=tuple(d for d in on_disk if d.step > newest and d.uri not in known),
        had_checkpoints=bool(state.checkpoints),
        restart=failed and not state.checkpoints,
        retired=tuple(
            sorted({c.step for c in state.checkpoints if c.status == "pruned"} - {c.step for c in valid})
        ),
    )


def restarted_in_place(state: RunState | None, restarts: int, opened: int | None) -> FailIntent | None:
    """The failure torchrun restarted a running run's workers for, `restarts` times
    (TORCHELASTIC_RESTART_COUNT), in the attempt `opened` (None: the log's): the log never heard of it
    otherwise. None when there is nothing to record."""
    if state is None or state.status != "running" or restarts <= 0:
        return None
    return FailIntent(
        reason="exit-code",
        message=f"torchrun restarted the workers (TORCHELASTIC_RESTART_COUNT={restarts})",
        attempt=opened or state.attempt,
    )


def skipped_line(step: int, reason: str) -> str:
    """The line for a checkpoint a resume refused, from the CLI or from a trainer."""
    return f"checkpoint step {step} {reason} → skipped"


def rank_count(count: int) -> str:
    """`1 rank`, `2 ranks`: a world's size in a line a user reads."""
    return f"{count} rank" if count == 1 else f"{count} ranks"


def resumed_line(resumed: ResumeIntent, epoch: int) -> str:
    """The line a trainer prints once it resumed: the step and epoch, the worlds when they differ, the data
    position when the loader keeps a global one."""
    changed = (
        f", saved by {rank_count(resumed.saved_world)}, resumed by {resumed.world}"
        if resumed.saved_world is not None and resumed.saved_world != resumed.world
        else ""
    )
    data = resumed.data
    at = f", data at sample {data.offset} of epoch {data.epoch}" if data is not None else ""
    tier = f", from {resumed.tier}" if resumed.tier is not None else ""
    return f"RESUMED from step={resumed.step} (epoch={epoch}){changed}{at}{tier}"


def no_valid_refusal(where: str, found_now: int, run_id: str | None) -> str:
    """Why a trainer refuses to start over when checkpoints exist and none is valid (`found_now` of them
    found corrupt by this start; 0: all by an earlier one), saying what to look at and how to start over on
    purpose."""
    found = (
        f"{found_now} checkpoint(s) found corrupt now"
        if found_now
        else "every checkpoint was found corrupt by an earlier start"
    )
    if run_id:
        then = (
            f"`ftrain status {run_id}` lists what the log recorded; to train from step 0 on purpose, launch a "
            "new run id"
        )
    else:
        then = (
            "to train from step 0 on purpose, start once with resume=False (the reference trainer's "
            "--no-resume)"
        )
    return (
        f"no valid checkpoint in {where}: {found}, set aside there as step-N.corrupt-<time> (kept as "
        f"evidence: inspect them there); refusing to start over. {then}"
    )
