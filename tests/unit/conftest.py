"""The unit tier starts no server: a unit test that asks for one (`server`, and through it `env`, `app` and
`cli`; `weed`, `moto` or `s3`) fails before any starts, saying where it belongs."""

import pytest

SERVERS = frozenset({"server", "shared_nats", "weed", "moto", "s3"})
"""The fixtures of tests/conftest.py that start a server."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    asked = sorted(SERVERS.intersection(getattr(item, "fixturenames", ())))
    if asked:
        pytest.fail(f"a unit test asks for a server ({', '.join(asked)}): it belongs in tests/integration/")
