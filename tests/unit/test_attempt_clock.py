"""What the trainer reports on `checkpointed` for goodput (`ftrain.train.attempt_clock`), on a hand-driven clock:
the same timelines `tests/unit/test_goodput.py` folds."""

import msgspec
from msgspec import UNSET

from ftrain.events.schema import INT64_MAX, MAX_AMOUNT, Checkpointed, encode_event
from ftrain.train.attempt_clock import AttemptClock


class Hand:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def event(step: int) -> Checkpointed:
    return Checkpointed(
        run_id="r", step=step, epoch=0, shards=2, uri="u", checkpoint_hash="h", size_bytes=3, attempt=2
    )


def measure(clock: AttemptClock, hand: Hand, step: int, at: float) -> tuple[object, ...]:
    hand.now = at
    got = clock.measured(step, event(step))
    assert msgspec.structs.replace(got, stall_seconds=UNSET, train_seconds=UNSET, loop_seconds=UNSET,
                                   lost_steps=UNSET, lost_seconds=UNSET) == event(step)  # fmt: skip
    return got.stall_seconds, got.train_seconds, got.loop_seconds, got.lost_steps


def started(at: float) -> tuple[AttemptClock, Hand]:
    hand = Hand()
    clock = AttemptClock(hand)
    hand.now = at
    clock.start()
    return clock, hand


def test_a_sync_save_reports_its_stall_up_to_its_event_and_the_next_one_what_it_stalled_after() -> None:
    clock, hand = started(5.0)
    hand.now = 11.0
    clock.began(10)
    assert measure(clock, hand, 10, 12.0) == (1.0, 6.0, 7.0, UNSET)
    hand.now = 12.2
    clock.ended(10, 1.25)  # the whole save, recording and pruning included: training time excludes all of it
    hand.now = 18.25
    clock.began(20)
    assert measure(clock, hand, 20, 19.25) == (1.25, 12.0, 14.25, UNSET)  # its 1 s, and step 10's last 0.25 s


def test_an_async_save_reports_the_stall_the_loop_saw_not_the_time_to_its_event() -> None:
    clock, hand = started(5.0)
    hand.now = 11.0
    clock.began(10)
    hand.now = 11.5
    clock.ended(10, 0.5)  # staged (and waited for the previous save): the loop goes on
    hand.now = 13.0
    clock.began(20)  # the next save begins before the worker records step 10's event
    assert measure(clock, hand, 10, 14.0) == (0.5, 6.0, 9.0, UNSET)
    clock.ended(20, 0.25)
    assert measure(clock, hand, 20, 16.0) == (0.25, 7.5, 11.0, UNSET)
    hand.now = 17.0
    clock.began(30)  # every stall so far is out of the training time
    assert measure(clock, hand, 30, 17.5)[:2] == (0.5, 17.0 - 5.0 - 0.75)  # a save still holding the loop


def test_a_save_of_a_step_measured_before_is_measured_afresh() -> None:
    clock, hand = started(0.0)
    clock.began(10)
    clock.ended(10, 0.5)  # async: gave the loop back
    assert measure(clock, hand, 10, 2.0)[0] == 0.5
    hand.now = 3.0
    clock.began(10)  # the same step again, sync this time: still holding the loop at its event
    assert measure(clock, hand, 10, 3.5)[0] == 0.5


def test_the_steps_the_previous_attempt_lost_are_reported_on_every_save_within_bounds() -> None:
    clock, hand = started(0.0)
    clock.lost(4)
    clock.began(10)
    assert measure(clock, hand, 10, 1.0)[3] == 4
    clock.lost(-3)
    clock.began(20)
    assert measure(clock, hand, 20, 2.0)[3] == 0
    clock.lost(2**70)
    clock.began(30)
    assert measure(clock, hand, 30, 3.0)[3] == INT64_MAX


def test_the_lost_steps_time_is_reported_when_timed_within_bounds_and_absent_when_not() -> None:
    clock, hand = started(0.0)
    clock.lost(4, 2.5)
    clock.began(10)
    hand.now = 1.0
    assert clock.measured(10, event(10)).lost_seconds == 2.5
    clock.lost(4, -1.0)  # a clock that stepped back
    clock.began(20)
    assert clock.measured(20, event(20)).lost_seconds == 0.0
    clock.lost(4, float("inf"))
    clock.began(30)
    assert clock.measured(30, event(30)).lost_seconds == MAX_AMOUNT
    clock.lost(4)
    clock.began(40)
    got = clock.measured(40, event(40))
    assert (got.lost_steps, got.lost_seconds) == (4, UNSET)


def test_the_loop_starts_at_construction_until_start_says_otherwise() -> None:
    hand = Hand()
    hand.now = 2.0
    clock = AttemptClock(hand)
    hand.now = 3.0
    clock.began(1)
    assert measure(clock, hand, 1, 4.0) == (1.0, 1.0, 2.0, UNSET)


def test_an_event_built_without_a_save_begun_stalled_nothing() -> None:
    clock, hand = started(1.0)
    hand.now = 2.0
    clock.ended(7, 0.5)  # a save whose event was never built (it failed closed): the next event reports it
    assert measure(clock, hand, 9, 4.0) == (0.5, 2.5, 3.0, UNSET)
    clock.began(11)
    assert measure(clock, hand, 11, 4.0)[0] == 0.0  # reported once


def test_what_it_reports_is_always_within_the_schemas_bounds() -> None:
    clock, hand = started(10.0)
    hand.now = 5.0  # a clock that went back
    clock.began(1)
    assert measure(clock, hand, 1, 4.0) == (0.0, 0.0, 0.0, UNSET)
    hand.now = 3 * MAX_AMOUNT
    clock.began(2)
    reported = clock.measured(2, event(2))
    assert reported.train_seconds == MAX_AMOUNT and reported.loop_seconds == MAX_AMOUNT
    encode_event(reported)  # the event's own bounds hold


def test_the_training_so_far_leaves_every_stall_out() -> None:
    """What a memory snapshot reports: the loop's time since its start, less each save's and snapshot's stall."""
    clock, hand = started(5.0)
    hand.now = 12.0
    clock.began(10)
    clock.ended(10, 1.0)
    hand.now = 15.0
    clock.ended(12, 0.5)  # a snapshot's stage: no event of its own to build
    hand.now = 16.0
    assert clock.trained() == 16.0 - 5.0 - 1.5
    assert measure(clock, hand, 10, 16.0)[:2] == (1.5, 7.0), "the snapshot's stall goes on the next event"
