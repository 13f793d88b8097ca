"""What the log says to a tracker: one `Write` per accepted event of the run, in seq order. Pure.

Tags describe the run as the log judges it now (its id, state, signer, attempt, newest valid checkpoint);
metrics are per event, at the training step it happened at: a checkpoint's step and stall, a failure's
step, a resume's step and attempt, and after each the run's goodput and lost steps so far."""

from collections.abc import Sequence

from msgspec import UNSET

from ftrain.events.schema import AnyEvent, Checkpointed, Completed, Failed, Resumed
from ftrain.projections.goodput import measure
from ftrain.service.run_queries import RunView
from ftrain.trackers.tracker_port import Write

BROKEN = "broken"
"""The `ftrain.state` of a run whose chain is broken or unvouched, whatever it folded to."""


def run_tags(view: RunView) -> dict[str, str]:
    """The run as the log judges it now: only what the log says, never the environment or a host path
    beyond the checkpoint URI."""
    state = view.state
    tags = {"ftrain.run_id": view.run_id, "ftrain.state": BROKEN}
    if state is None:
        return tags
    tags.update(
        {"ftrain.state": BROKEN if view.broken else state.status, "ftrain.attempt": str(state.attempt)}
    )
    if view.vouched is not None and view.vouched.signer is not None:
        tags["ftrain.signer"] = view.vouched.signer
    if newest := next(iter(state.valid_checkpoints()), None):
        tags.update({"ftrain.checkpoint_uri": newest.uri, "ftrain.checkpoint_hash": newest.checkpoint_hash})
    return tags


def writes(events: Sequence[AnyEvent], tags: dict[str, str], after: int, limit: int) -> list[Write]:
    """The writes of the run's accepted events (in chain order, from `launched`) with seq above `after`, at
    most `limit` of them, each carrying `tags`."""
    out: list[Write] = []
    step = 0
    for i, event in enumerate(events):
        metrics: dict[str, float] = {}
        if isinstance(event, Checkpointed):
            step = event.step
            metrics["ftrain.checkpoint_step"] = step
            if event.stall_seconds is not UNSET:
                metrics["ftrain.stall_seconds"] = event.stall_seconds
        elif isinstance(event, Failed):
            metrics["ftrain.failure_step"] = step
        elif isinstance(event, Resumed):
            step = event.step
            metrics.update({"ftrain.resume_step": step, "ftrain.attempt": event.attempt})
        if event.seq <= after:
            continue
        if isinstance(event, Checkpointed | Failed | Resumed | Completed):
            goodput = measure(events[: i + 1], event.time)
            if goodput.ratio is not None:
                metrics["ftrain.goodput"] = goodput.ratio
            if goodput.lost_steps is not None:
                metrics["ftrain.lost_steps"] = goodput.lost_steps
        out.append(Write(seq=event.seq, at=event.time, step=step, tags=tags, metrics=metrics))
        if len(out) == limit:
            break
    return out
