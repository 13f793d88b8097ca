"""`--checkpoint-every` values: a duration (`10min`, `90s`, `2h`) or a step count (`500steps`)."""

import re

from ftrain.events.schema import CheckpointPolicy

_UNITS = {"s": 1, "sec": 1, "secs": 1, "m": 60, "min": 60, "mins": 60, "h": 3600, "hr": 3600, "hrs": 3600}
_PATTERN = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")


def parse_checkpoint_every(text: str) -> CheckpointPolicy:
    """A `--checkpoint-every` value as the schema's `CheckpointPolicy`; ValueError naming the accepted forms."""
    match = _PATTERN.fullmatch(text.strip().lower())
    if match:
        number, unit = float(match.group(1)), match.group(2)
        if unit in ("step", "steps") and number.is_integer() and number >= 1:
            return CheckpointPolicy(text=text, steps=int(number))
        if unit in _UNITS and number > 0:
            return CheckpointPolicy(text=text, seconds=number * _UNITS[unit])
    raise ValueError(
        f"--checkpoint-every {text!r}: use a duration like 10min, 90s, 2h or a count like 500steps"
    )
