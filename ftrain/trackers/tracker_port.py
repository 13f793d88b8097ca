"""The seam every tracker sits behind: one write of tags and metrics into the run's tracker run.

A third tracker is one module with a class that has `name` and `write` (and, if it continues runs through
an id the supervisor must create, a call like `MlflowServer.create_run`)."""

from datetime import datetime
from typing import Protocol

import msgspec


class TrackerDown(Exception):
    """The tracker did not take a write (unreachable, refused, timed out): retried later, never fatal."""


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """What one log event says to the tracker: tags (replacing earlier values) and metrics at `step`."""

    seq: int
    """The run's event seq it comes from: writes are delivered in seq order, each once."""
    at: datetime
    step: int
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    metrics: dict[str, float] = msgspec.field(default_factory=dict)


class Tracker(Protocol):
    """A tracker run ftrain writes the lifecycle of one run into."""

    name: str
    """Names the tracker in logs and in the delivery cursor (`mlflow`)."""

    def write(self, write: Write) -> None:
        """Deliver `write`, within a short timeout; raises TrackerDown when the tracker did not take it."""
        ...
