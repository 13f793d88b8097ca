"""Scrapes: every run's figures from the caught-up read model and the log, rendered. What `ftrain metrics`
serves at /metrics, and what another server of ftrain's mounts there (read-only: it never appends).

The read model gives each run's state and judgement (`RunService.views`, caught up first, as every query).
The goodput terms and the failures by reason come from the runs' events, which the read model does not keep:
a `Scraper` walks the log once and then, at each scrape, only what was appended since (its chain check is
the one `status` and `replay` make), so a scrape costs the runs' count, not the log's length.
"""

from collections import defaultdict

from ftrain.domain.chain_walk import ChainWalk, Finding
from ftrain.events.schema import AnyEvent, now
from ftrain.metrics.exposition import render
from ftrain.metrics.figures import RunFigures, figures_of
from ftrain.service import RunService


class Scraper:
    """The scrapes of one service. Not safe for two scrapes at once: the caller serializes them."""

    def __init__(self, app: RunService) -> None:
        self.app = app
        self._reset(None)

    def _reset(self, model: tuple[str | None, int] | None) -> None:
        self._model = model
        self._walk = ChainWalk()
        self._events: defaultdict[str, list[AnyEvent]] = defaultdict(list)
        self._next = 1

    async def figures(self) -> list[RunFigures]:
        """Every run's figures as of now."""
        views = await self.app.views()
        at = await self.app.model.position()
        if (at.stream_id, at.generation) != self._model or await self.app.store.last_seq() < self._next - 1:
            self._reset((at.stream_id, at.generation))  # another stream, or the model rebuilt: walk it again
        async for records in self.app.store.read(self._next):
            for record in records:
                outcome = self._walk.feed(record)
                if not isinstance(outcome, Finding):
                    self._events[record.run_id].append(outcome.event)
            self._next = records[-1].stream_seq + 1
        moment = now()
        return [figures_of(view, self._events.get(view.run_id, ()), moment) for view in views]

    async def __call__(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition of every run, and its Content-Type (`accept`: the request's Accept header)."""
        return render(await self.figures(), accept)
