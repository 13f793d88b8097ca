"""What a trainer asks of the log at start-up: its own run's state, folded from its own events only.

Training must never stall on the log: the query is bounded, and an unreachable log sends the trainer to the
checkpoint directory itself (the newest directory whose marker and manifest agree). The query reads the
run's subject alone, so it costs the same whatever else the stream holds.
"""

import asyncio

import structlog
from nats.errors import Error as NatsError

from ftrain.domain.command_handler import BrokenRun, RunLog
from ftrain.domain.lifecycle import RunState
from ftrain.errors import FtrainError, UnknownRun
from ftrain.events.jetstream.connection import NatsSettings, open_store
from ftrain.events.jetstream.nats_server import NatsServerError
from ftrain.events.keyring import KeyringError
from ftrain.events.log_port import LogTampered, LogUnavailable
from ftrain.workers.recorder import Recorder

FLUSH_TIMEOUT = 15.0
log = structlog.get_logger(__name__)


class RunBroken(FtrainError):
    """The run's chain is broken: its state cannot be trusted, so nothing is resumed, set aside or recorded."""


def read_run(
    run_id: str, settings: NatsSettings, timeout: float, recorder: Recorder | None = None
) -> RunState | None:
    """The state of `run_id` from its own events; None if the log cannot be read within `timeout` seconds,
    or when `recorder` (the trainer's) cannot append what its outbox still holds for the run (what
    the previous attempt left) within FLUSH_TIMEOUT. Raises UnknownRun when the log is readable but knows no
    such run, RunBroken when its chain is broken."""
    if recorder is not None and not recorder.flush(FLUSH_TIMEOUT):
        log.warning("outbox_not_flushed", run_id=run_id)
        return None

    async def query() -> RunState | None:
        async with open_store(settings) as store:
            await store.ensure_stream()
            return await RunLog(store, run_id).state()

    try:
        state = asyncio.run(asyncio.wait_for(query(), timeout))
    except (BrokenRun, LogTampered, KeyringError) as exc:
        raise RunBroken(f"{exc}; refusing to resume") from exc
    except (LogUnavailable, NatsServerError, NatsError, OSError, TimeoutError) as exc:
        log.warning("log_unreachable", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        return None
    if state is None:
        raise UnknownRun(f"unknown run {run_id!r}")
    return state
