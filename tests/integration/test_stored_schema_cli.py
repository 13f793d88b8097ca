"""`ftrain events schema` through the real console script prints the stored payload's JSON Schema (the schema
itself, against every stored vector: tests/unit/test_stored_schema.py)."""

import json

from ftrain.events.stored_schema import stored_schema
from tests.support.processes import ftrain_process


def test_the_cli_prints_the_stored_schema() -> None:
    result = ftrain_process(["events", "schema"], {})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(stored_schema()))
