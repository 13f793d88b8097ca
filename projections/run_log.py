"""One run's own log: its events folded on demand, and appends decided against them.

The port through which the trainer, the outbox and every command append: it reads the run's own subject
(`ftrain.run.<id>.*`), never the whole stream and never the read model, so its cost does not grow with other
runs. Each append is decided against the freshly folded state, judged, and published with the run's head as
the expected position; when another writer got there first, it folds the new events and decides again.
"""

from collections.abc import Callable

from ftrain.events.chain import ChainHead
from ftrain.events.log_port import AppendConflict, Appended, EventLog
from ftrain.events.schema import AnyEvent
from ftrain.projections.audit import ChainWalk, Finding
from ftrain.projections.lifecycle import RunState, check

CONFLICT_RETRIES = 20

Decide = Callable[[RunState | None], AnyEvent | None]


class BrokenRun(Exception):
    """The run's chain or state machine is broken, or no trusted writer's signature covers its newest
    events: its state cannot be trusted, nothing is appended and nothing acted on."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(f"run {finding.run_id}'s log is broken: {finding.describe()}")
        self.finding = finding


class ContendedRun(Exception):
    """Other writers kept appending to the run between every read and publish."""


class RunLog:
    """The log of one run over one event store; remembers how far it has folded."""

    def __init__(self, store: EventLog, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self._walk = ChainWalk(trust=store.trust)
        self._read_to = 0  # stream sequence folded so far

    async def state(self) -> RunState | None:
        """The run's state after every event stored so far (None: no event yet). Raises BrokenRun."""
        async for records in self.store.read(self._read_to + 1, run_id=self.run_id):
            for record in records:
                self._walk.feed(record)
            self._read_to = records[-1].stream_seq
        if finding := self._walk.findings.get(self.run_id):
            raise BrokenRun(finding)
        if isinstance(vouched := self._walk.vouched(self.run_id), Finding):
            raise BrokenRun(vouched)
        return self._walk.states.get(self.run_id)

    async def append(self, decide: Decide) -> Appended | None:
        """Append what `decide` makes of the current state, judged first; None when it decides nothing.
        Raises IllegalTransition, BrokenRun, or ContendedRun after CONFLICT_RETRIES lost races."""
        for _ in range(CONFLICT_RETRIES):
            state = await self.state()
            event = decide(state)
            if event is None:
                return None
            check(state, event)
            try:
                return await self.store.append(event, state.head if state else ChainHead())
            except AppendConflict:
                continue
        raise ContendedRun(
            f"run {self.run_id}: gave up after {CONFLICT_RETRIES} conflicting concurrent appends"
        )
