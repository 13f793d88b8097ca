"""The unit tier starts no server: a unit test that asks for one (`server`, and through it `env`, `app` and
`cli`) fails, saying where it belongs."""

import pytest


@pytest.fixture
def server() -> None:
    pytest.fail("a unit test asks for a nats-server (the `server` fixture): it belongs in tests/integration/")
