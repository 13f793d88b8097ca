"""The command handler: one run's own log, its events folded on demand, and appends decided against them.

The port through which the trainer, the outbox and every command append: it reads the run's own subject
(`ftrain.run.<id>.*`), never the whole stream and never the read model, so its cost does not grow with other
runs. Each append is decided against the freshly folded state, judged, and published with the run's head as
the expected position; when another writer got there first, it folds the new events and decides again.
"""

from collections.abc import Callable

from ftrain.domain.chain_walk import ChainWalk, Finding
from ftrain.domain.lifecycle import RunState, apply, check
from ftrain.events.chain import ChainHead
from ftrain.events.log_port import AppendConflict, Appended, EventLog
from ftrain.events.schema import AnyEvent

CONFLICT_RETRIES = 20

Decide = Callable[[RunState | None], AnyEvent | None]


class BrokenRun(Exception):
    """The run's chain or state machine is broken, or no trusted writer's signature covers its newest
    events: its state cannot be trusted, nothing is appended and nothing acted on."""

    def __init__(self, finding: Finding, accepted: RunState | None = None) -> None:
        super().__init__(f"run {finding.run_id}'s log is broken: {finding.describe()}")
        self.finding = finding
        self.accepted = accepted
        """The state its events accepted before the break (None: none was)."""


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
        accepted = self._walk.states.get(self.run_id)
        if finding := self._walk.findings.get(self.run_id):
            raise BrokenRun(finding, accepted)
        if isinstance(vouched := self._walk.vouched(self.run_id), Finding):
            raise BrokenRun(vouched, accepted)
        return accepted

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

    def after(self, appended: Appended) -> RunState:
        """The run's state after `appended`, this log's own latest append, folded without reading it back:
        the append named the head this log had read, so nothing landed in between."""
        return apply(self._walk.states.get(self.run_id), appended.event, appended.head)
