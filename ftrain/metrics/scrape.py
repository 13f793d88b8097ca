"""One scrape: every run's figures from the caught-up read model and the log, rendered. What `ftrain
metrics` serves at /metrics, and what another server of ftrain's mounts there (read-only: it never appends).

The read model gives each run's state and judgement (`RunService.views`, caught up first, as every query);
the goodput terms and the failures by reason come from the runs' events, read in one walk of the stream
(the per-run reads `status` makes would cost one round trip per run).
"""

from collections import defaultdict

from ftrain.events.schema import AnyEvent, now
from ftrain.history import timeline
from ftrain.metrics.exposition import render
from ftrain.metrics.figures import RunFigures, figures_of
from ftrain.service import RunService


async def figures(app: RunService) -> list[RunFigures]:
    """Every run's figures as of now."""
    views = await app.views()
    events: defaultdict[str, list[AnyEvent]] = defaultdict(list)
    async for entry in timeline(app.store):
        if entry.event is not None:
            events[entry.run_id].append(entry.event)
    moment = now()
    return [figures_of(view, events[view.run_id], moment) for view in views]


async def scrape(app: RunService, accept: str | None = None) -> tuple[bytes, str]:
    """The exposition of every run, and its Content-Type (`accept`: the request's Accept header)."""
    return render(await figures(app), accept)
