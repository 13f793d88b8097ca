"""One record through the chain check and the fold: the chain walk the command handler, the projector
and `audit verify` share."""

import msgspec

from ftrain.domain.lifecycle import IllegalTransition, RunState, apply
from ftrain.domain.vouching import Unvouched, Vouched, Vouching
from ftrain.events.chain import Broken, ChainHead, check_link
from ftrain.events.record import StoredRecord
from ftrain.events.schema import AnyEvent
from ftrain.events.signing import Signature, TrustList


class Finding(msgspec.Struct, frozen=True):
    """The first event of a run that breaks its chain or its state machine."""

    run_id: str
    stream_seq: int
    seq: int | None
    event_type: str
    reason: str

    def describe(self) -> str:
        """One line naming run, sequence and what broke."""
        at = f"seq {self.seq}" if self.seq is not None else "an unsequenced event"
        return f"run {self.run_id}: {at} ({self.event_type}, stream seq {self.stream_seq}): {self.reason}"


class Folded(msgspec.Struct, frozen=True):
    """A record that extended its run: the decoded event, its hash, and the run's new state."""

    event: AnyEvent
    hash: str
    state: RunState
    signature: Signature | None = None


def fold_record(state: RunState | None, record: StoredRecord) -> Folded | Finding:
    """Check `record` against the run's chain head and state machine, and fold it in if both accept it."""
    head = state.head if state is not None else ChainHead()
    link = check_link(head, record.run_id, record.event_type, record.payload)
    if isinstance(link, Broken):
        return Finding(
            record.run_id, record.stream_seq, link.seq, link.event_type or record.event_type, link.reason
        )
    try:
        new_state = apply(state, link.event, ChainHead(link.event.seq, link.hash, record.stream_seq))
    except IllegalTransition as exc:
        reason = f"illegal transition: {exc}"
        return Finding(record.run_id, record.stream_seq, link.event.seq, record.event_type, reason)
    return Folded(link.event, link.hash, new_state, link.signature)


class ChainWalk:
    """Folds records of many runs in stream order, keeping each run's state and its first break.

    After a run's first break every later record of that run is refused too: its chain cannot be trusted.
    A stray record (filed under no run's subject) is refused and kept in `strays`; it breaks no run.
    Given a trust list, it also follows whose signatures cover each run (`vouching`): one check per run.
    """

    def __init__(
        self,
        states: dict[str, RunState | None] | None = None,
        broken: set[str] | None = None,
        trust: TrustList | None = None,
    ) -> None:
        self.states: dict[str, RunState | None] = states if states is not None else {}
        self.broken: set[str] = broken if broken is not None else set()
        self.findings: dict[str, Finding] = {}
        self.strays: list[Finding] = []
        self.vouching = Vouching(trust) if trust is not None else None

    def vouched(self, run_id: str) -> Vouched | Finding | None:
        """Who vouches for the run, or its first event no trusted signature covers as a finding (None: no
        event of it folded, or no trust list was given)."""
        verdict = self.vouching.verdict(run_id) if self.vouching else None
        if isinstance(verdict, Unvouched):
            return Finding(run_id, verdict.stream_seq, verdict.seq, verdict.event_type, verdict.reason)
        return verdict

    def feed(self, record: StoredRecord) -> Folded | Finding:
        """Check and fold one record."""
        run_id = record.run_id
        if record.stray:
            reason = f"filed under no run: {record.subject} is not ftrain.run.<run_id>.<event_type>"
            self.strays.append(Finding(run_id, record.stream_seq, None, record.event_type, reason))
            return self.strays[-1]
        if run_id in self.broken:
            return Finding(run_id, record.stream_seq, None, record.event_type, "after a chain break")
        outcome = fold_record(self.states.get(run_id), record)
        if isinstance(outcome, Finding):
            self.broken.add(run_id)
            self.findings[run_id] = outcome
        else:
            self.states[run_id] = outcome.state
            if self.vouching is not None:
                event = outcome.event
                self.vouching.see(
                    run_id, event.seq, record.stream_seq, record.event_type, outcome.hash, outcome.signature
                )
        return outcome
