"""`events.redact`: a URL's password or token never reaches a message or a log line."""

import pytest

from ftrain.events.redact import redact_text, redact_url, redact_urls


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://trainer:s3cret@host:4222", "nats://trainer:***@host:4222"),
        ("nats://t0ken@host", "nats://***@host"),
        ("tls://u:p@ss@host:4222", "tls://u:***@host:4222"),
        ("trainer:s3cret@host:4222", "trainer:***@host:4222"),
        ("nats://host:4222", "nats://host:4222"),
        ("host:4222", "host:4222"),
    ],
)
def test_a_url_loses_its_secret_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_lists_and_free_text_are_redacted() -> None:
    assert redact_urls(["nats://a:b@h1:1", " nats://h2:2"]) == "nats://a:***@h1:1,nats://h2:2"
    text = "dial nats://trainer:s3cret@h:4222 failed; token t0ken refused, user@host is fine"
    assert redact_text(text, ["t0ken", None]) == (
        "dial nats://trainer:***@h:4222 failed; token *** refused, user@host is fine"
    )
