"""What the metrics say about one run, as plain numbers: its judged view (`RunService.views`) and its
accepted events in, a `RunFigures` out. Pure: the moment is passed in, nothing is read.

A figure the log cannot give is None (the series is left out, never exported as 0). A failure's reason is
free text a publisher chose: it is counted under one of the schema's `FAILURE_REASONS`, or `other`.
"""

from collections.abc import Sequence
from datetime import datetime

import msgspec
from msgspec import UNSET

from ftrain.events.schema import FAILURE_REASONS, AnyEvent, Checkpointed, Failed
from ftrain.projections.goodput import Goodput, measure
from ftrain.service.run_queries import RunView

OTHER_REASON = "other"
REASONS = (*FAILURE_REASONS, OTHER_REASON)
"""Every value of the `reason` label: a closed set."""
BROKEN_STATE = "broken"
STATES = ("running", "failed", "completed", BROKEN_STATE)
"""Every value of the `state` label: a broken or unvouched run is `broken` whatever it folded to, as
`status --json` shows it."""


class RunFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One run's figures as of a moment. Times are seconds; timestamps seconds since the epoch."""

    run_id: str
    project: str
    """The launch's project ("" when none of the run's events was accepted)."""
    state: str
    broken: bool
    """Its chain is broken, or no trusted writer vouches for it."""
    step: int | None = None
    attempt: int | None = None
    restarts: int = 0
    failures: dict[str, int] = msgspec.field(default_factory=dict)
    """Failures by reason (each in `REASONS`); reasons with none are absent."""
    goodput: Goodput | None = None
    last_valid_checkpoint_age: float | None = None
    last_valid_checkpoint_step: int | None = None
    last_stall: float | None = None
    """The stall its newest checkpoint reported (None: it reported none, or there is none)."""
    checkpoint_interval: float | None = None
    """Its cadence in seconds: `--checkpoint-every`'s duration, or its step count × the run's seconds a step."""
    attempt_running: float | None = None
    """Seconds the current attempt has been running (None unless the run is running)."""
    last_event: float | None = None
    """Timestamp of its newest accepted event."""


def reason_label(reason: str) -> str:
    """A failure's reason as a label value: one the schema names, or `other`."""
    return reason if reason in FAILURE_REASONS else OTHER_REASON


def figures_of(view: RunView, events: Sequence[AnyEvent], moment: datetime) -> RunFigures:
    """The figures of the run `view` shows, whose accepted events in chain order are `events`."""
    state = view.state
    broken = view.broken is not None
    if state is None:
        return RunFigures(run_id=view.run_id, project="", state=BROKEN_STATE, broken=True)
    goodput = measure(events, moment) if events else None
    failures: dict[str, int] = {}
    for event in events:
        if isinstance(event, Failed):
            label = reason_label(event.reason)
            failures[label] = failures.get(label, 0) + 1
    saves = [e for e in events if isinstance(e, Checkpointed)]
    valid = next(iter(state.valid_checkpoints()), None)
    return RunFigures(
        run_id=state.run_id,
        project=state.project,
        state=BROKEN_STATE if broken else state.status,
        broken=broken,
        step=state.step,
        attempt=state.attempt,
        restarts=state.resume_count,
        failures=failures,
        goodput=goodput,
        last_valid_checkpoint_age=None if valid is None else _since(valid.recorded.time, moment),
        last_valid_checkpoint_step=None if valid is None else valid.recorded.step,
        last_stall=None if not saves or saves[-1].stall_seconds is UNSET else saves[-1].stall_seconds,
        checkpoint_interval=_interval(view, goodput),
        attempt_running=None if state.running_since is None else _since(state.running_since, moment),
        last_event=state.updated_at.timestamp(),
    )


def _since(then: datetime, moment: datetime) -> float:
    """Seconds from `then` to `moment`, never negative (two hosts' clocks may disagree by a little)."""
    return max((moment - then).total_seconds(), 0.0)


def _interval(view: RunView, goodput: Goodput | None) -> float | None:
    policy = view.state.launch.checkpoint_policy if view.state else None
    if policy is None:
        return None
    if policy.seconds is not None:
        return policy.seconds
    pace = goodput.step_seconds if goodput else None
    return None if policy.steps is None or pace is None else policy.steps * pace
