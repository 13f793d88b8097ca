"""Run ids become NATS subject tokens and directory names, so they are validated in one place."""

import re

RUN_ID_MAX = 128
RUN_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]*"
"""Letters, digits, '-' and '_', starting with a letter or digit (unanchored: callers anchor it)."""
_RUN_ID = re.compile(RUN_ID_PATTERN)


class InvalidRunId(ValueError):
    """A run id that would be unsafe as a subject token or a path component."""


def is_run_id(text: str) -> bool:
    """Whether `text` is a valid run id (the rule `validate_run_id` enforces)."""
    return 0 < len(text) <= RUN_ID_MAX and _RUN_ID.fullmatch(text) is not None


def validate_run_id(run_id: str, *, what: str = "run id") -> str:
    """Return `run_id` unchanged, or raise InvalidRunId saying why it is refused."""
    if not run_id:
        raise InvalidRunId(f"{what} is empty")
    if len(run_id) > RUN_ID_MAX:
        raise InvalidRunId(f"{what} is {len(run_id)} characters long (at most {RUN_ID_MAX})")
    if not _RUN_ID.fullmatch(run_id):
        raise InvalidRunId(
            f"{what} {run_id!r} is invalid: use letters, digits, '-' and '_', starting with a letter or digit"
        )
    return run_id
