"""The subjects the event store files a run's records under, and what a subject says back (the store against a
real nats-server: tests/integration/test_store.py)."""

from ftrain.events.record import parse_subject, run_subject


def test_subjects() -> None:
    assert run_subject("r1") == "ftrain.run.r1.*"
    assert run_subject("r1", "failed") == "ftrain.run.r1.failed"
    assert parse_subject("ftrain.run.r1.failed") == ("r1", "failed")
    assert parse_subject("ftrain.run.a.b.failed") == ("a.b", "failed")  # never valid: reported, not skipped
    assert parse_subject("ftrain.run.x") == ("x", "")
