"""The stream read back against its anchors (`events.anchors`): what `audit verify` reports as lost.

Fed every record in stream order beside the chain walk, it checks that each anchored run head is still in
the log with the hash anchored, that the first N records still have the root an earlier audit anchored, and
that the stream is the one anchored (not re-created, reconfigured or shorter). Notes from before the last
`server repair` are not held against the log: the operator accepted what was lost then, on record.
"""

from pathlib import Path

from ftrain.domain.chain_walk import Finding, Folded
from ftrain.domain.lifecycle import RunState
from ftrain.events.anchor_file import read_lines
from ftrain.events.anchors import IGNORED, Anchor, PrefixRoot, StreamFacts, chain_of, stream_change
from ftrain.events.chain import ChainHead
from ftrain.events.record import StoredRecord
from ftrain.events.signing import TrustList

REPAIR = "repair:"


class AnchorCheck:
    """One audit's comparison of the stream with the notes anchored before it."""

    def __init__(
        self, notes: list[Anchor], problems: list[str], run_id: str | None, ignored: list[str] | None = None
    ) -> None:
        self.problems = problems
        self.ignored = ignored or []
        self.newest = max(notes, key=lambda n: n.time, default=None)
        repairs = [n for n in notes if n.note.startswith(REPAIR)]
        self.accepted = [
            f"{n.time.isoformat()} {n.note}" for n in repairs if n.note != f"{REPAIR} nothing differed"
        ]
        since = max((n.time for n in repairs), default=None)
        current = [n for n in notes if since is None or n.time >= since]
        self._expected: dict[str, Anchor] = {}
        for note in current:
            if note.run_id is not None and note.seq is not None and run_id in (None, note.run_id):
                known = self._expected.get(note.run_id)
                if known is None or note.seq >= (known.seq or 0):
                    self._expected[note.run_id] = note
        rooted = [n for n in current if n.root is not None] if run_id is None else []
        self._rooted = max(rooted, key=lambda n: n.stream_seq, default=None)
        self._root = PrefixRoot() if run_id is None else None
        self._root_differs = False
        self._seen: dict[str, str] = {}

    @classmethod
    def load(cls, paths: list[Path], trust: TrustList, run_id: str | None) -> "AnchorCheck":
        """Read every anchor file as every open reads it (`events.anchors.walk_back`): only the notes a
        trusted writer vouches for count; a gap in a file's chain is a problem, and the lines that do not
        count (unsigned, a stranger's, a copy) are reported as `ignored`, never held against the log."""
        notes: list[Anchor] = []
        problems: list[str] = []
        ignored: list[str] = []
        for path in paths:
            chain, found = chain_of(read_lines(path), trust)
            for why in found:
                (ignored if why.endswith(IGNORED) else problems).append(f"anchor file {path}: {why}")
            notes += [note.anchor for note in chain]
        return cls(notes, problems, run_id, ignored)

    def feed(self, record: StoredRecord, outcome: Folded | Finding) -> None:
        """Take in one record and what the chain walk made of it."""
        if self._root is not None:
            self._root.add(record.stream_seq, record.run_id, record.event_type, record.payload)
            rooted = self._rooted
            if rooted is not None and self._root.size == rooted.stream_seq:
                self._root_differs = self._root.value() != rooted.root
        expected = self._expected.get(record.run_id)
        if expected is not None and isinstance(outcome, Folded) and outcome.event.seq == expected.seq:
            self._seen[record.run_id] = outcome.hash

    def run_findings(self, states: dict[str, RunState | None]) -> list[Finding]:
        """Each anchored run head the log no longer holds as anchored."""
        findings = []
        for run_id, note in sorted(self._expected.items()):
            at = f"anchored at {note.time.isoformat()}"
            seen = self._seen.get(run_id)
            if seen == note.head_hash:
                continue
            if run_id not in states:
                reason = f"the log holds none of its events, {at} with head seq {note.seq}"
            elif seen is not None:
                anchored = (note.head_hash or "")[:12]
                reason = f"seq {note.seq} is another event than the one {at} (hash {anchored}…)"
            else:
                state = states[run_id]
                head = state.head.seq if state is not None else 0
                reason = f"its head went back from seq {note.seq} ({at}) to seq {head}: events were removed"
            findings.append(Finding(run_id, note.stream_seq, note.seq, "", reason))
        return findings

    def stream_findings(self, facts: StreamFacts | None) -> list[str]:
        """What is wrong with the stream as a whole (and with the anchor files themselves)."""
        found = list(self.problems)
        if self.newest is not None and (change := stream_change(self.newest, facts)) is not None:
            found.append(change)
        rooted = self._rooted
        if rooted is not None and self._root_differs:
            found.append(
                f"the first {rooted.stream_seq} records of the stream differ from those an audit anchored "
                f"at {rooted.time.isoformat()}: the log was rewritten"
            )
        return found

    @property
    def root_size(self) -> int:
        """How many records the root covers (0 for a one-run audit)."""
        return self._root.size if self._root is not None else 0

    def root(self) -> str | None:
        """The root of every record read (None for a one-run audit)."""
        return self._root.value() if self._root is not None and self._root.size else None

    def unanchored(self, heads: dict[str, ChainHead]) -> dict[str, ChainHead]:
        """The heads not anchored yet as they are now."""
        return {
            r: h
            for r, h in heads.items()
            if (n := self._expected.get(r)) is None or (n.seq, n.head_hash) != (h.seq, h.hash)
        }
