"""Reading the log back as an auditor would: every chain re-verified from the stream, and the timeline.

Neither touches the read model: both walk the stored records themselves, so they check what the projection
was built from rather than trusting it.
"""

from collections.abc import AsyncIterator

import msgspec

from ftrain.domain.chain_walk import ChainWalk, Finding
from ftrain.events.log_port import EventLog
from ftrain.events.schema import AnyEvent
from ftrain.projections.log_anchors import AnchorCheck


class AuditReport(msgspec.Struct, frozen=True):
    """`audit verify`: events checked, runs seen, the first break of each broken run, who vouches for each
    run (its signer's name; None: unsigned, accepted by the trust list), what the anchors say was lost or
    changed, the changes an operator accepted (`server repair`), and the anchor lines that do not count
    (unsigned, a stranger's, a copy: reported, never a finding)."""

    events: int
    runs: int
    findings: list[Finding]
    signers: dict[str, str | None] = msgspec.field(default_factory=dict)
    stream_findings: list[str] = msgspec.field(default_factory=list)
    accepted: list[str] = msgspec.field(default_factory=list)
    ignored: list[str] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every chain verified, a trusted writer vouches for every run, and the stream holds
        everything anchored."""
        return not self.findings and not self.stream_findings


class TimelineEntry(msgspec.Struct, frozen=True):
    """One record of `replay`: the event when it folded, or the break it caused."""

    stream_seq: int
    run_id: str
    event_type: str
    event: AnyEvent | None
    hash: str | None
    finding: Finding | None


async def verify(store: EventLog, run_id: str | None = None) -> AuditReport:
    """Re-verify every chain from the stream itself: hashes, links, sequence, legal transitions, one
    signature per run, and the stream against its anchors. A whole-log audit that finds nothing anchors
    every run's head and the root of what it read."""
    anchors = AnchorCheck.load(store.anchors.paths if store.anchors else [], store.trust, run_id)
    facts = await store.facts()  # after the anchors: a writer anchoring in between is then no rollback
    walk, events = ChainWalk(trust=store.trust), 0
    if facts is not None:  # a stream that is gone has nothing to read: the anchors report it
        async for records in store.read(1, run_id=run_id):
            for record in records:
                anchors.feed(record, walk.feed(record))
            events += len(records)
    runs = sorted(walk.states.keys() | walk.broken)
    findings = list(walk.findings.values())
    signers: dict[str, str | None] = {}
    for run in runs:
        if run in walk.findings:
            continue
        verdict = walk.vouched(run)
        if isinstance(verdict, Finding):
            findings.append(verdict)
        elif verdict is not None:
            signers[run] = verdict.signer
    findings += anchors.run_findings(walk.states)
    stream_findings = [f"stream seq {s.stream_seq}: {s.reason}" for s in walk.strays]
    stream_findings += anchors.stream_findings(facts)
    report = AuditReport(
        events, len(runs), findings, signers, stream_findings, anchors.accepted, anchors.ignored
    )
    if report.ok and run_id is None and facts is not None:
        heads = {r: s.head for r, s in walk.states.items() if s is not None}
        store.anchor_heads(anchors.unanchored(heads), anchors.root_size, anchors.root())
    return report


async def timeline(store: EventLog, run_id: str | None = None) -> AsyncIterator[TimelineEntry]:
    """Every event in stream order, each with its verdict."""
    walk = ChainWalk()
    async for records in store.read(1, run_id=run_id):
        for record in records:
            outcome = walk.feed(record)
            if isinstance(outcome, Finding):
                yield TimelineEntry(record.stream_seq, record.run_id, record.event_type, None, None, outcome)
            else:
                yield TimelineEntry(
                    record.stream_seq, record.run_id, record.event_type, outcome.event, outcome.hash, None
                )
