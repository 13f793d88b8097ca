"""What rank 0 measures for goodput and reports on each `checkpointed` (`projections.goodput` folds it): when
this attempt's training loop began, its training time before each save, how long each save held the loop, and
the steps its resume re-did with their time. Torch-free, and the clock is injectable, so it is tested without a
job.

`CheckpointManager` owns one: `start()` once resume is done, `began(step)` and `ended(step, stall)` around each
save, and `measured(step, event)` where the event is built. Each event reports the stall not reported yet, so
the events' stalls add up to every stall before the newest: a sync save builds its event inside the save (its
stall up to the event; what it stalls after, recording the event and pruning, goes on the next event), an async
save builds it on the save worker after `ended` (the copy to host memory plus the wait for the previous save),
and a save that failed without an event hands its stall to the next one.
"""

import time
from collections.abc import Callable

import msgspec

from ftrain.events.schema import INT64_MAX, MAX_AMOUNT, Checkpointed


def _amount(seconds: float) -> float:
    """Within the schema's bounds for seconds, whatever the clock did."""
    return min(max(seconds, 0.0), MAX_AMOUNT)


class AttemptClock:
    """One process's account of its training loop: loop start, saves begun, stalls."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._loop_start = clock()
        self._stalled = 0.0
        """Every save's stall so far, as `ended` was told it."""
        self._reported = 0.0
        """The stall the events built so far reported."""
        self._saves: dict[int, tuple[float, float]] = {}
        """Saves whose event is still to be built: step → (when it began, training time before it)."""
        self._ended: set[int] = set()
        """Those of them that gave the loop back already (async)."""
        self._lost: tuple[int, float | None] | None = None
        """The steps the previous attempt trained past this one's checkpoint, and their loop time if known."""

    def start(self) -> None:
        """The training loop begins now: start-up and restore are done."""
        self._loop_start = self._clock()

    def lost(self, steps: int, seconds: float | None = None) -> None:
        """The previous attempt had trained `steps` past the checkpoint this one resumed from, in `seconds`
        of its training loop (None: not timed)."""
        self._lost = (min(max(steps, 0), INT64_MAX), None if seconds is None else _amount(seconds))

    def trained(self) -> float:
        """The attempt's training so far: its loop's time from its start, less every stall."""
        return _amount(self._clock() - self._loop_start - self._stalled)

    def began(self, step: int) -> None:
        """The save of `step` takes the loop now."""
        now = self._clock()
        self._saves[step] = (now, now - self._loop_start - self._stalled)

    def ended(self, step: int, stall: float) -> None:
        """The save of `step` gave the loop back after `stall` seconds."""
        self._stalled += stall
        if step in self._saves:  # its event is still to be built
            self._ended.add(step)

    def measured(self, step: int, event: Checkpointed) -> Checkpointed:
        """`event` (the save of `step`) with what this clock measured."""
        now = self._clock()
        began, trained = self._saves.pop(step, (now, now - self._loop_start - self._stalled))
        running = 0.0 if step in self._ended else now - began  # a sync save: still holding the loop
        self._ended.discard(step)
        stall = self._stalled - self._reported + running
        self._reported += stall
        return msgspec.structs.replace(
            event,
            stall_seconds=_amount(stall),
            train_seconds=_amount(trained),
            loop_seconds=_amount(now - self._loop_start),
            lost_steps=msgspec.UNSET if self._lost is None else self._lost[0],
            lost_seconds=msgspec.UNSET if self._lost is None or self._lost[1] is None else self._lost[1],
        )
