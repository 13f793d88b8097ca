"""Every error ftrain raises on purpose, as one tree under `FtrainError`, and the exit code each maps to.

A script catches `FtrainError`, or one kind of it (the tree: docs/training-script.md, "Errors a script can
handle"). Each class keeps the built-in base it had (`RuntimeError` for the trainer's) and the modules that
defined them still export them, so existing `except` clauses go on working. Torch-free: the CLI imports it.

The CLI's exit codes (aligned with git and kubectl: a request that is understood but cannot be met is 1, one
that is not understood is 2):

==========  ===================================================================================================
exit code   meaning
==========  ===================================================================================================
0           success
1           refused on the merits (`Refused`): an illegal transition, no valid checkpoint, a failed audit or a
            broken chain, the event log unreachable, no embedded server running for a read-only command; not
            found (`NotFound`): an unknown run, an unknown key; `ftrain run`: gave up retrying
2           usage or bad input (`UsageError`): a malformed option or setting, a home that is not private to this
            user; nothing was written
3           `ftrain server status` / `ftrain storage status`: the server is not running (as LSB's `status`)
128+N       `ftrain run` stopped by signal N (130: interrupted by Ctrl-C; 141: output pipe closed, SIGPIPE)
==========  ===================================================================================================

Every refusal is one line on stderr; a usage error or a refusal writes nothing.
"""

from typing import Final

from ftrain.events.base_error import FtrainError
from ftrain.workers.storage.storage_errors import Fenced, MissingCredentials, StorageUnavailable

__all__ = [
    "Fenced",
    "FtrainError",
    "MissingCredentials",
    "NoValidCheckpoint",
    "NotFound",
    "Refused",
    "ResumeFailed",
    "ResumeRefused",
    "ResumeStopped",
    "SavesFailing",
    "StorageUnavailable",
    "UnknownRun",
    "UnresumableState",
    "UsageError",
]

OK: Final = 0
REFUSED: Final = 1
USAGE: Final = 2
NOT_RUNNING: Final = 3
SIGNALLED: Final = 128
"""`run` stopped by signal N exits SIGNALLED + N."""


class UsageError(FtrainError):
    """Bad input: exit 2, nothing written."""


class Refused(FtrainError):
    """Refused on the merits (illegal transition, no valid checkpoint, failed audit): exit 1."""


class NotFound(Refused):
    """What the command names does not exist (an unknown run, an unknown key): exit 1, as git and kubectl."""


class NoValidCheckpoint(FtrainError, RuntimeError):
    """Checkpoints exist and none of them verified: the job must stop, not start over."""


class ResumeRefused(FtrainError, RuntimeError):
    """The start-up request cannot be served as asked: it contradicts the log (e.g. --no-resume on a run that
    has checkpoints), or the checkpoint location is one this job can never use (it cannot be written, or the
    run's directory is a link)."""


class UnknownRun(ResumeRefused):
    """The log answered and has never heard of the run: nothing to resume by."""


class ResumeStopped(FtrainError, RuntimeError):
    """The log or the storage cannot be trusted right now (a broken chain, storage out of reach): stop on
    every rank, recording nothing and setting nothing aside; a later start, once it is fixed, resumes."""


class StoppedByCredentials(ResumeStopped, MissingCredentials):
    """A resume stopped because the storage found no credentials or refused them."""


class ResumeFailed(FtrainError, RuntimeError):
    """Loading a checkpoint failed for a reason outside it (memory, I/O): stop, and skip nothing."""


class SavesFailing(FtrainError, RuntimeError):
    """Too many saves in a row failed (storage out of reach, a full disk): the job stops on every rank."""


class UnresumableState(FtrainError, RuntimeError):
    """The state holds an item a resume would refuse: the save is refused on every rank, nothing written."""


EXIT_CODES: Final = ((OK, "success"), (REFUSED, "refused on the merits, or not found"),
                     (USAGE, "usage or bad input"), (NOT_RUNNING, "server status: not running"),
                     (SIGNALLED, "+N: stopped by signal N"))  # fmt: skip
"""The table above as data, for a generated reference page."""
