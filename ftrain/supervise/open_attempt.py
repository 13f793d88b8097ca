"""Opening an attempt: the `resumed` a relaunch appends to the run's own log before it starts any process.

The append is a compare-and-set on the run's head, so of two supervisors relaunching one run exactly one
opens the attempt; the other finds the run running and is refused. A relaunch that cannot reach the log
does not start: an attempt the log never opened could not be fenced off from the next.
"""

import asyncio

import msgspec
from msgspec import UNSET
from nats.errors import Error as NatsError

from ftrain.domain.command_handler import BrokenRun, ContendedRun, RunLog
from ftrain.domain.lifecycle import IllegalTransition, RunState, relaunch
from ftrain.events.jetstream.connection import NatsSettings, open_store
from ftrain.events.jetstream.nats_server import NatsServerError
from ftrain.events.keyring import KeyringError
from ftrain.events.log_port import EventLog, LogTampered, LogUnavailable
from ftrain.events.schema import Resumed, SchedulerJob

OPEN_TIMEOUT = 30.0


class NotOpened(Exception):
    """The attempt was not opened: another supervisor opened it, the run cannot be relaunched, or the log
    is out of reach. The message is one line."""


async def append_relaunch(
    store: EventLog,
    run_id: str,
    hosts: tuple[str, ...],
    job: SchedulerJob | None = None,
    mlflow_run_id: str | None = None,
) -> Resumed:
    """Open the next attempt of `run_id` (a failed run), on `hosts`, from the scheduler's `job` (if in one),
    continuing the MLflow run `mlflow_run_id` (if any). Raises NotOpened."""

    def decide(state: RunState | None) -> Resumed:
        if state is None:
            raise IllegalTransition(f"unknown run {run_id!r}")
        return msgspec.structs.replace(
            relaunch(state, hosts), job=job or UNSET, mlflow_run_id=mlflow_run_id or UNSET
        )

    try:
        appended = await RunLog(store, run_id).append(decide)
    except (IllegalTransition, BrokenRun, ContendedRun) as exc:
        raise NotOpened(str(exc)) from exc
    assert appended is not None and isinstance(appended.event, Resumed)
    return appended.event


def open_attempt(
    run_id: str,
    nats: NatsSettings,
    hosts: tuple[str, ...],
    timeout: float = OPEN_TIMEOUT,
    job: SchedulerJob | None = None,
    mlflow_run_id: str | None = None,
) -> int:
    """Open the next attempt of `run_id`, on `hosts`, through its log (continuing the MLflow run
    `mlflow_run_id`, if any); returns its number. Raises NotOpened."""

    async def go() -> Resumed:
        async with open_store(nats) as store:
            await store.ensure_stream()
            return await append_relaunch(store, run_id, hosts, job, mlflow_run_id)

    try:
        return asyncio.run(asyncio.wait_for(go(), timeout)).attempt
    except (LogTampered, KeyringError) as exc:
        raise NotOpened(str(exc)) from exc
    except (LogUnavailable, NatsServerError, NatsError, OSError) as exc:  # OSError covers TimeoutError
        raise NotOpened(f"the event log is out of reach ({type(exc).__name__}: {exc})") from exc
