"""The two ways a command is refused, mapped to exit codes by the CLI."""


class UsageError(Exception):
    """Bad input: exit 2, nothing written."""


class Refused(Exception):
    """Refused on the merits (illegal transition, no valid checkpoint, failed audit): exit 1."""
