"""What a trainer asks of the log at start-up: the run's state, or None when the log is out of reach.

Training must never stall on the log: the query is bounded, and an unreachable log sends the trainer to the
checkpoint directory itself (the newest directory whose marker and manifest agree).
"""

import asyncio
from collections.abc import Mapping

import structlog
from nats.errors import Error as NatsError

from events.jetstream.server import NatsServerError
from events.jetstream.store import LogUnavailable
from ftrain.service import Ftrain
from projections.lifecycle import RunState

log = structlog.get_logger(__name__)


def read_run(run_id: str, env: Mapping[str, str], timeout: float) -> RunState | None:
    """The caught-up state of `run_id`; None if the log cannot be read within `timeout` seconds.
    UsageError when the log is readable and has never heard of the run."""

    async def query() -> RunState:
        async with Ftrain.open(env) as app:
            return await app.run(run_id)

    try:
        return asyncio.run(asyncio.wait_for(query(), timeout))
    except (LogUnavailable, NatsServerError, NatsError, OSError, TimeoutError) as exc:
        log.warning("log_unreachable", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        return None
