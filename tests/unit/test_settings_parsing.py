"""`ftrain.settings`: every FTRAIN_* variable, its default, and the one-line refusal of a malformed value (the
console script's refusals: tests/integration/test_settings.py)."""

import logging
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import nkeys
import pytest

from ftrain import settings
from ftrain.events.jetstream.connection import NatsSettings
from ftrain.settings import InvalidSetting
from ftrain.workers.storage.file.checkpoint_dir import confined
from ftrain.workers.storage.location import storage_root
from ftrain.workers.storage.storage_errors import StorageError

DEFAULT_HOME = Path.home() / ".local/share/ftrain"


def test_nothing_set_reads_as_the_defaults() -> None:
    assert settings.home({}) == DEFAULT_HOME
    assert settings.storage({}) == str(DEFAULT_HOME / "checkpoints")
    assert settings.nats({}) == NatsSettings(home=DEFAULT_HOME)
    assert settings.log_level({}) == logging.WARNING
    assert settings.kill_targets({}) == frozenset()
    assert settings.kill_once({}) is None
    assert settings.run_id({}) is None
    assert settings.ckpt_dir({}) is None


def test_an_empty_value_reads_as_unset() -> None:
    names = [
        value for value in vars(settings).values() if isinstance(value, str) and value.startswith("FTRAIN_")
    ]
    empty = dict.fromkeys(names, "")
    assert len(empty) == 35
    read = (
        settings.home(empty),
        settings.storage(empty),
        settings.nats(empty),
        settings.log_level(empty),
        settings.kill_targets(empty),
        settings.stop_targets(empty),
        settings.kill_once(empty),
        settings.step_delay(empty),
        settings.replica_delay(empty),
        settings.run_id(empty),
        settings.ckpt_dir(empty),
        settings.attempt(empty),
        settings.ckpt_location(empty),
        settings.max_failed_saves(empty),
        settings.checkpoint_every(empty),
        settings.dataset_revision(empty),
        settings.save_signals(empty),
        settings.progress_dir(empty),
        settings.stop_note(empty),
        settings.digest(empty),
        settings.memory_every(empty),
        settings.memory_dir(empty),
        settings.memory_cap(empty),
    )
    assert read == (
        DEFAULT_HOME,
        str(DEFAULT_HOME / "checkpoints"),
        NatsSettings(home=DEFAULT_HOME),
        logging.WARNING,
        frozenset(),
        frozenset(),
        None,
        0.0,
        0.0,
        None,
        None,
        None,
        None,
        3,
        None,
        None,
        (signal.SIGUSR1, signal.SIGTERM),
        None,
        None,
        "sha256",
        None,
        Path("/dev/shm"),
        None,
    )


def test_max_failed_saves() -> None:
    assert settings.max_failed_saves({"FTRAIN_MAX_FAILED_SAVES": "5"}) == 5
    for bad in ("0", "-1", "x"):
        with pytest.raises(settings.InvalidSetting, match="FTRAIN_MAX_FAILED_SAVES"):
            settings.max_failed_saves({"FTRAIN_MAX_FAILED_SAVES": bad})


def test_home_and_storage(tmp_path: Path) -> None:
    env = {"FTRAIN_HOME": str(tmp_path / "home")}
    assert settings.home(env) == tmp_path / "home"
    assert settings.storage(env) == str(tmp_path / "home" / "checkpoints")
    assert settings.storage({**env, "FTRAIN_STORAGE": "file:///lustre/ckpt"}) == "file:///lustre/ckpt"


def test_every_nats_variable_reaches_the_connection_settings(tmp_path: Path) -> None:
    env = {
        "FTRAIN_HOME": str(tmp_path),
        "FTRAIN_NATS_URL": "nats://a:4222, tls://b:4222",
        "FTRAIN_NATS_USER": "trainer",
        "FTRAIN_NATS_PASSWORD": "s3cret",
        "FTRAIN_NATS_TOKEN": "t0ken",
        "FTRAIN_NATS_CREDS": "/etc/ftrain/user.creds",
        "FTRAIN_NATS_TLS_CA": "/etc/ftrain/ca.pem",
        "FTRAIN_NATS_TLS_CERT": "/etc/ftrain/client.pem",
        "FTRAIN_NATS_TLS_KEY": "/etc/ftrain/client.key",
        "FTRAIN_STREAM_REPLICAS": "3",
    }
    assert settings.nats(env) == NatsSettings(
        home=tmp_path,
        url="nats://a:4222, tls://b:4222",
        user="trainer",
        password="s3cret",
        token="t0ken",
        creds="/etc/ftrain/user.creds",
        tls_ca="/etc/ftrain/ca.pem",
        tls_cert="/etc/ftrain/client.pem",
        tls_key="/etc/ftrain/client.key",
        replicas=3,
    )


@pytest.mark.parametrize("url", ["localhost:4222", "ws://a:8080", "WSS://a:443,wss://b:443"])
def test_urls_with_or_without_a_nats_scheme_are_accepted(url: str) -> None:
    assert settings.nats({"FTRAIN_NATS_URL": url}).url == url


def test_each_server_of_the_url_list_is_an_address_its_default_port_filled_in() -> None:
    url = "nats://u:secret@a:4223, tls://b, localhost:4222,wss://c"
    assert settings.nats_addresses({"FTRAIN_NATS_URL": url}) == [
        ("a", 4223), ("b", 4222), ("localhost", 4222), ("c", 443),
    ]  # fmt: skip
    assert settings.nats_addresses({}) == []  # the embedded server
    with pytest.raises(InvalidSetting, match="out of range") as caught:
        settings.nats_addresses({"FTRAIN_NATS_URL": "nats://u:secret@a:99999"})
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FTRAIN_STREAM_REPLICAS": "0"}, "FTRAIN_STREAM_REPLICAS must be 1..5, got '0'"),
        ({"FTRAIN_STREAM_REPLICAS": "6"}, "FTRAIN_STREAM_REPLICAS must be 1..5, got '6'"),
        ({"FTRAIN_STREAM_REPLICAS": "three"}, "FTRAIN_STREAM_REPLICAS must be 1..5, got 'three'"),
        ({"FTRAIN_NATS_URL": " , "}, "FTRAIN_NATS_URL=' , ': no server in it"),
        (
            {"FTRAIN_NATS_URL": "nats://a:4222,http://b"},
            "FTRAIN_NATS_URL='nats://a:4222,http://b': http:// is not a NATS scheme",
        ),
        ({"FTRAIN_NATS_PASSWORD": "s3cret"}, "FTRAIN_NATS_PASSWORD is set but FTRAIN_NATS_USER is not"),
        ({"FTRAIN_NATS_TLS_KEY": "/k"}, "FTRAIN_NATS_TLS_KEY is set without FTRAIN_NATS_TLS_CERT"),
    ],
)
def test_a_malformed_nats_setting_is_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidSetting, match="^" + re.escape(message)) as caught:
        settings.nats(env)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "level"), [("debug", logging.DEBUG), ("INFO", logging.INFO), ("Error", logging.ERROR)]
)
def test_log_level_names_in_any_case(text: str, level: int) -> None:
    assert settings.log_level({"FTRAIN_LOG_LEVEL": text}) == level


@pytest.mark.parametrize("text", ["loud", "10", "notset"])
def test_an_unknown_log_level_is_refused(text: str) -> None:
    with pytest.raises(InvalidSetting, match=f"FTRAIN_LOG_LEVEL='{text}': use one of debug, info, warning"):
        settings.log_level({"FTRAIN_LOG_LEVEL": text})


def test_kill_and_stop_points_and_the_once_directory(tmp_path: Path) -> None:
    env = {
        "FTRAIN_KILL_AT": "step:3, finalize:20,,write:3",
        "FTRAIN_STOP_AT": "sealed:10",
        "FTRAIN_KILL_ONCE": str(tmp_path / "kills"),
    }
    assert settings.kill_targets(env) == {("step", 3), ("finalize", 20), ("write", 3)}
    assert settings.stop_targets(env) == {("sealed", 10)}
    assert settings.kill_once(env) == tmp_path / "kills"


@pytest.mark.parametrize("name", ["FTRAIN_KILL_AT", "FTRAIN_STOP_AT"])
@pytest.mark.parametrize("text", ["boom:3", "step:x", "step:", "write", "fanout:-1", "step:3,boom:4"])
def test_a_malformed_fault_point_is_refused_naming_the_accepted_points(name: str, text: str) -> None:
    with pytest.raises(
        InvalidSetting,
        match=rf"^{name}=.* with point one of step, stage, write, fanout, finalize, sealed, snapshot_sealed, snapshot$",
    ):
        (settings.kill_targets if name == "FTRAIN_KILL_AT" else settings.stop_targets)({name: text})


@pytest.mark.parametrize(
    ("parse", "name"),
    [(settings.step_delay, "FTRAIN_STEP_DELAY"), (settings.replica_delay, "FTRAIN_REPLICA_DELAY")],
)
def test_an_injected_delay_is_seconds_up_to_a_minute(
    parse: Callable[[dict[str, str]], float], name: str
) -> None:
    assert [parse({name: t}) for t in ("0", "0.5", "60")] == [0.0, 0.5, 60.0]
    for bad in ("x", "-1", "60.5", "nan", "inf", "1s"):
        with pytest.raises(InvalidSetting, match=rf"^{name}='{bad}': expected seconds from 0 to 60$"):
            parse({name: bad})


def test_what_the_supervisor_sets_for_the_trainer(tmp_path: Path) -> None:
    env = {settings.RUN_ID: "dist-P-1x8-fsdp", settings.CKPT_DIR: str(tmp_path / "ckpt")}
    assert (settings.run_id(env), settings.ckpt_dir(env)) == ("dist-P-1x8-fsdp", tmp_path / "ckpt")


def test_a_run_id_unsafe_as_a_subject_token_is_refused() -> None:
    with pytest.raises(InvalidSetting, match=r"^FTRAIN_RUN_ID 'a\.b' is invalid"):
        settings.run_id({"FTRAIN_RUN_ID": "a.b"})


def test_an_nkey_seed_file_reaches_the_connection_settings(tmp_path: Path) -> None:
    seed = tmp_path / "user.nk"
    seed.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) + b"\n")
    env = {"FTRAIN_HOME": str(tmp_path), "FTRAIN_NATS_URL": "nats://a:4222", "FTRAIN_NATS_NKEY": str(seed)}
    assert settings.nats(env).nkey == str(seed)


def test_an_unusable_nkey_setting_is_refused_without_quoting_the_file(tmp_path: Path) -> None:
    account = tmp_path / "account.nk"
    account.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))
    garbage = tmp_path / "garbage.nk"
    garbage.write_text("SUnot-a-seed-at-all")
    cases = {
        str(tmp_path / "missing.nk"): "cannot read it (No such file or directory)",
        str(tmp_path): "cannot read it (Is a directory)",
        str(account): "not a user nkey seed file (one line, SU…)",
        str(garbage): "not a user nkey seed file (one line, SU…)",
    }
    for path, why in cases.items():
        with pytest.raises(InvalidSetting) as caught:
            settings.nats({"FTRAIN_NATS_URL": "nats://a:4222", "FTRAIN_NATS_NKEY": path})
        assert str(caught.value) == f"FTRAIN_NATS_NKEY={path!r}: {why}"
        assert "not-a-seed" not in str(caught.value)
    with pytest.raises(InvalidSetting, match=r"^FTRAIN_NATS_NKEY and FTRAIN_NATS_CREDS are both set"):
        settings.nats({"FTRAIN_NATS_NKEY": str(account), "FTRAIN_NATS_CREDS": "/c"})


def test_a_refused_url_is_quoted_without_its_password() -> None:
    with pytest.raises(InvalidSetting) as caught:
        settings.nats({"FTRAIN_NATS_URL": "nats://trainer:s3cret@a:4222,http://t0ken@b"})
    assert str(caught.value).startswith("FTRAIN_NATS_URL='nats://trainer:***@a:4222,http://***@b': http://")
    assert "s3cret" not in str(caught.value) and "t0ken" not in str(caught.value)


NOT_UTF8 = os.fsdecode(b"/data/ckpt-\xff")
"""A path as the environment hands over bytes that are not UTF-8: the byte as a surrogate escape."""


@pytest.mark.parametrize(
    "variable",
    ["FTRAIN_HOME", "FTRAIN_STORAGE", "FTRAIN_ANCHOR_MIRROR", "FTRAIN_CKPT_DIR", "FTRAIN_NATS_TOKEN"],
)
def test_a_setting_that_is_not_utf8_is_refused_naming_it_and_never_quoted(variable: str) -> None:
    env = {variable: NOT_UTF8 + "-s3cret"}
    with pytest.raises(InvalidSetting) as caught:
        (settings.nats(env), settings.storage(env), settings.ckpt_dir(env))
    assert str(caught.value) == f"{variable} is not UTF-8 text (byte 0xff at offset 11)"


def test_a_file_uri_whose_escapes_are_not_utf8_is_refused() -> None:
    uri = "file:///data/ckpt-%FF/x"
    with pytest.raises(InvalidSetting) as caught:
        settings.storage({"FTRAIN_STORAGE": uri})
    assert str(caught.value).startswith(f"FTRAIN_STORAGE={uri!r}: its %-escapes are not UTF-8")
    assert settings.storage({"FTRAIN_STORAGE": "file:///data/ckpt-%C3%A9"}) == "file:///data/ckpt-%C3%A9"
    assert settings.storage({"FTRAIN_STORAGE": "/data/ckpt-%FF"}) == "/data/ckpt-%FF"  # a path: no escapes


def test_a_checkpoint_uri_whose_escapes_are_not_utf8_names_no_directory(tmp_path: Path) -> None:
    """The same rule where a URI comes from the log: `%FF` once decoded to U+FFFD, another directory."""
    run = tmp_path / "r1"
    (run / "step-\ufffd").mkdir(parents=True)
    for uri in (f"file://{run}/step-%FF", f"{run}/step-\udcff"):
        with pytest.raises(StorageError, match="not UTF-8 once its %-escapes are decoded"):
            storage_root(uri)
        assert confined(uri, run) is None
    assert confined(f"file://{run}/step-%EF%BF%BD", run) == run / "step-\ufffd"


def test_save_signals_are_named_scheduler_warnings_or_none() -> None:
    assert settings.save_signals({"FTRAIN_SAVE_SIGNALS": "usr2, SIGXCPU"}) == (signal.SIGUSR2, signal.SIGXCPU)
    assert settings.save_signals({"FTRAIN_SAVE_SIGNALS": "none"}) == ()
    for bad in ("KILL", "STOP", "USR1;TERM", "9"):
        with pytest.raises(settings.InvalidSetting, match=r"^FTRAIN_SAVE_SIGNALS="):
            settings.save_signals({"FTRAIN_SAVE_SIGNALS": bad})


@pytest.mark.parametrize(
    ("text", "algorithm"),
    [(None, "sha256"), ("sha256", "sha256"), ("blake3", "blake3"), ("BLAKE3", "blake3")],
)
def test_the_digest_of_new_checkpoint_files_is_sha256_unless_blake3_is_chosen(
    text: str | None, algorithm: str
) -> None:
    assert settings.digest({} if text is None else {"FTRAIN_DIGEST": text}) == algorithm


@pytest.mark.parametrize("text", ["md5", "crc32", "xxh3", "sha-256", "blake3 "])
def test_a_digest_that_is_not_one_ftrain_hashes_with_is_refused_naming_the_choices(text: str) -> None:
    """Never a non-cryptographic checksum, never a guess: one line naming the variable and the choices."""
    with pytest.raises(
        InvalidSetting, match=f"^FTRAIN_DIGEST={re.escape(repr(text))}: use one of sha256, blake3$"
    ):
        settings.digest({"FTRAIN_DIGEST": text})
