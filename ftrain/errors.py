"""How a command is refused, and the exit code each way maps to (the CLI's one table, aligned with git and
kubectl: a request that is understood but cannot be met is 1, one that is not understood is 2).

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

OK: Final = 0
REFUSED: Final = 1
USAGE: Final = 2
NOT_RUNNING: Final = 3
SIGNALLED: Final = 128
"""`run` stopped by signal N exits SIGNALLED + N."""


class UsageError(Exception):
    """Bad input: exit 2, nothing written."""


class Refused(Exception):
    """Refused on the merits (illegal transition, no valid checkpoint, failed audit): exit 1."""


class NotFound(Refused):
    """What the command names does not exist (an unknown run, an unknown key): exit 1, as git and kubectl."""


EXIT_CODES: Final = ((OK, "success"), (REFUSED, "refused on the merits, or not found"),
                     (USAGE, "usage or bad input"), (NOT_RUNNING, "server status: not running"),
                     (SIGNALLED, "+N: stopped by signal N"))  # fmt: skip
"""The table above as data, for a generated reference page."""
