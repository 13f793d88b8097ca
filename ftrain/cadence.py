"""`--checkpoint-every` values: a duration or a step count.

- a duration: one or more number-unit pairs, largest unit first, each unit once: `90s`, `10min`, `2h`,
  `1h30m`, `1d12h`, `1.5h` (units: d, h/hr/hrs, m/min/mins, s/sec/secs);
- Slurm's time forms, as `--time` takes them: `MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`, `D-HH`, `D-HH:MM`;
- a step count: `500steps` (`1step`).

Bounded: a duration above 0 and at most `MAX_SECONDS` (a year), a count from 1 to `MAX_STEPS`; anything else
is a ValueError whose message names the accepted forms (the CLI's exit 2).
"""

import re
from typing import Final

from ftrain.events.schema import INT64_MAX, CheckpointPolicy

MAX_SECONDS: Final = 366 * 86400.0
MAX_STEPS: Final = INT64_MAX
_UNITS: Final = {"d": 86400, "day": 86400, "days": 86400, "h": 3600, "hr": 3600, "hrs": 3600, "m": 60,
                 "min": 60, "mins": 60, "s": 1, "sec": 1, "secs": 1}  # fmt: skip
_PAIR = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)")
_STEPS = re.compile(r"(\d+)\s*steps?")
_SLURM = re.compile(r"(?:(\d+)-(\d{1,2})(?::(\d{1,2})(?::(\d{1,2}))?)?|(?:(\d{1,2}):)?(\d{1,2}):(\d{1,2}))")
FORMS: Final = (
    "use a duration like 10min, 90s, 2h or a count like 500steps (also 1h30m, Slurm's [D-]HH:MM:SS or MM:SS)"
)


def parse_checkpoint_every(text: str) -> CheckpointPolicy:
    """A `--checkpoint-every` value as the schema's `CheckpointPolicy`; ValueError naming the accepted forms."""
    value = text.strip().lower()
    if steps := _STEPS.fullmatch(value):
        count = int(steps.group(1))
        if not 1 <= count <= MAX_STEPS:
            raise ValueError(f"--checkpoint-every {text!r}: a step count is between 1 and {MAX_STEPS}")
        return CheckpointPolicy(text=text, steps=count)
    seconds = _slurm_seconds(value) if ":" in value or "-" in value else _compound_seconds(value)
    if seconds is None:
        raise ValueError(f"--checkpoint-every {text!r}: {FORMS}")
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"--checkpoint-every {text!r}: a duration is above 0 and at most 366 days")
    return CheckpointPolicy(text=text, seconds=seconds)


def _compound_seconds(value: str) -> float | None:
    """`1h30m` → 5400.0; None unless the whole text is number-unit pairs, units in descending order."""
    total, end, last = 0.0, 0, float("inf")
    for match in _PAIR.finditer(value):
        if match.start() != end or (size := _UNITS.get(match.group(2))) is None or size >= last:
            return None
        total, end, last = total + float(match.group(1)) * size, match.end(), size
    return total if end and end == len(value) else None


def _slurm_seconds(value: str) -> float | None:
    """Slurm's `D-HH[:MM[:SS]]` and `[HH:]MM:SS` → seconds; None when it is neither, or a field overflows
    (minutes and seconds below 60, hours below 24 after a day count)."""
    match = _SLURM.fullmatch(value)
    if match is None:
        return None
    days, day_hours, day_minutes, day_seconds, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    if match.group(1) is not None:
        hours, minutes, seconds = day_hours, day_minutes, day_seconds
        if hours >= 24:
            return None
    if minutes >= 60 or seconds >= 60:
        return None
    return float(days * 86400 + hours * 3600 + minutes * 60 + seconds)
