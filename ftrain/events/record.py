"""The stored format: a record as the stream holds it, and the subject grammar that files it under a run.

`ftrain.run.<run_id>.<event_type>`: consumers subscribe by these subjects; the chain check
(`events.chain.check_link`) is the one reader of a record's payload. A record under any other subject of the
stream (the bare `ftrain.run.<run_id>`, `ftrain.run.a.b.failed`) is a stray: no ftrain writer publishes
there, it belongs to no run and breaks none, and a whole-stream audit reports it.
"""

import msgspec

from ftrain.events.run_id import is_run_id

SUBJECT_ROOT = "ftrain.run"
STREAM = "FTRAIN_EVENTS"
"""The JetStream stream that holds every subject under `SUBJECT_ROOT`."""


def run_subject(run_id: str, event_type: str = "*") -> str:
    """`ftrain.run.<run_id>.<event_type>`; with the default, the wildcard over one run's events."""
    return f"{SUBJECT_ROOT}.{run_id}.{event_type}"


def parse_subject(subject: str) -> tuple[str, str]:
    """(run_id, event_type) of a subject in the stream.

    A subject no ftrain writer would use (`ftrain.run.a.b.failed`, `ftrain.run.x`) still parses, into a
    run id that cannot be valid or an empty event type: the record is a stray (`StoredRecord.stray`),
    reported, never skipped.
    """
    tokens = subject.split(".")[2:]
    return (".".join(tokens[:-1]), tokens[-1]) if len(tokens) > 1 else ("".join(tokens), "")


class StoredRecord(msgspec.Struct, frozen=True, gc=False):
    """One message of the stream, as stored: the raw payload is what the chain is verified over."""

    stream_seq: int
    run_id: str
    event_type: str
    payload: bytes

    @property
    def stray(self) -> bool:
        """Filed under no run: its subject is not `ftrain.run.<run_id>.<event_type>` with a valid run id."""
        return not self.event_type or not is_run_id(self.run_id)

    @property
    def subject(self) -> str:
        """The subject the record was stored under."""
        return ".".join(part for part in (SUBJECT_ROOT, self.run_id, self.event_type) if part)
