"""Pointing ftrain at a real server that requires credentials or TLS, and at a three-node JetStream cluster."""

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nkeys
import pytest

from tests.support.builders import SIGNER
from tests.support.nats_operator import operator_setup
from tests.support.processes import free_port, ftrain_process
from tests.support.servers import start_configured_server


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def scenario(env: dict[str, str]) -> None:
    """Launch, checkpoint, fail, resume, complete, verify: the log works end to end through this server."""
    steps = [
        ["launch", "P", "--nodes", "1", "--gpus-per-node", "2"],
        ["checkpoint", "dist-P-1x2", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}"],
        ["fail", "dist-P-1x2"],
        ["resume", "dist-P-1x2"],
        ["complete", "dist-P-1x2"],
    ]
    for args in steps:
        result = ftrain_process(args, env)
        assert result.returncode == 0, f"{args}: {result.stderr}"
    audit = ftrain_process(["audit", "verify"], env)
    assert (
        audit.stdout
        == f"Verified 5 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))\n"
    )


def base_env(tmp_path: Path, url: str) -> dict[str, str]:
    return {
        "FTRAIN_HOME": str(tmp_path / "home"),
        "FTRAIN_STORAGE": str(tmp_path / "ckpt"),
        "FTRAIN_NATS_URL": url,
    }


def test_user_password_and_token(tmp_path: Path, servers: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    store = tmp_path / "js"
    config = f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{store}" }}\n'
    config += 'authorization { users = [ { user: "trainer", password: "s3cret" } ] }\n'
    servers.append(start_configured_server(tmp_path / "srv", config, port))
    env = base_env(tmp_path, f"nats://127.0.0.1:{port}")
    scenario({**env, "FTRAIN_NATS_USER": "trainer", "FTRAIN_NATS_PASSWORD": "s3cret"})
    denied = ftrain_process(["list"], {**env, "FTRAIN_NATS_USER": "trainer", "FTRAIN_NATS_PASSWORD": "wrong"})
    assert denied.returncode == 1
    assert denied.stderr.startswith("ftrain list: event log unreachable at nats://127.0.0.1:")
    assert "Authorization Violation" in denied.stderr
    assert denied.stderr.count("\n") == 1

    token_port = free_port()
    config = f'listen: 127.0.0.1:{token_port}\njetstream {{ store_dir: "{tmp_path / "js2"}" }}\n'
    config += 'authorization { token: "t0ken" }\n'
    servers.append(start_configured_server(tmp_path / "srv2", config, token_port))
    scenario({**base_env(tmp_path / "t", f"nats://127.0.0.1:{token_port}"), "FTRAIN_NATS_TOKEN": "t0ken"})


def test_creds_file_on_an_operator_mode_server(
    tmp_path: Path, servers: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    config, creds = operator_setup(tmp_path / "srv", port)
    servers.append(start_configured_server(tmp_path / "srv", config, port))
    env = base_env(tmp_path, f"nats://127.0.0.1:{port}")
    scenario({**env, "FTRAIN_NATS_CREDS": str(creds)})
    anonymous = ftrain_process(["list"], env)
    assert anonymous.returncode == 1
    assert "event log unreachable" in anonymous.stderr and "Authorization Violation" in anonymous.stderr


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl command."""
    directory.mkdir()
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    ext = directory / "ext.cnf"
    ext.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ftrain-test-ca",
            "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "2", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key


def test_tls_with_a_private_ca(tmp_path: Path, servers: list[subprocess.Popen[bytes]]) -> None:
    ca, cert, key = make_certificates(tmp_path / "certs")
    port = free_port()
    config = f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
    config += f'tls {{ cert_file: "{cert}", key_file: "{key}" }}\n'
    servers.append(start_configured_server(tmp_path / "srv", config, port))
    env = base_env(tmp_path, f"tls://127.0.0.1:{port}")
    scenario({**env, "FTRAIN_NATS_TLS_CA": str(ca)})
    untrusted = ftrain_process(["list"], env)  # the system trust store does not know this CA
    assert untrusted.returncode == 1 and "event log unreachable" in untrusted.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr


def test_three_node_cluster_with_replicated_stream(
    tmp_path: Path, servers: list[subprocess.Popen[bytes]]
) -> None:
    clients = [free_port() for _ in range(3)]
    routes = [free_port() for _ in range(3)]
    route_urls = ", ".join(f"nats://127.0.0.1:{p}" for p in routes)
    for i in range(3):
        config = (
            f'server_name: n{i}\nlisten: 127.0.0.1:{clients[i]}\n'
            f'jetstream {{ store_dir: "{tmp_path / f"js{i}"}" }}\n'
            f'cluster {{ name: ftrain-test, listen: 127.0.0.1:{routes[i]}, routes: [{route_urls}] }}\n'
        )  # fmt: skip
        servers.append(start_configured_server(tmp_path / f"srv{i}", config, clients[i]))
    env = {
        **base_env(tmp_path, ",".join(f"nats://127.0.0.1:{p}" for p in clients)),
        "FTRAIN_STREAM_REPLICAS": "3",
    }
    deadline = time.monotonic() + 30  # JetStream needs a meta leader before the stream can be created
    while (first := ftrain_process(["list"], env)).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert first.returncode == 0, first.stderr
    scenario(env)
    # lose one node: the R3 stream keeps its quorum and every event; the client fails over
    servers[0].kill()
    servers[0].wait()
    after = ftrain_process(["status", "dist-P-1x2"], env)
    assert after.returncode == 0, after.stderr
    assert "state       completed" in after.stdout
    launch = ftrain_process(["launch", "P", "--nodes", "1", "--gpus-per-node", "2"], env)
    assert launch.stdout.startswith("Launched dist-P-1x2-2 ")


def test_an_nkey_seed_file_signs_in_to_a_server_of_ones_own(
    tmp_path: Path, servers: list[subprocess.Popen[bytes]]
) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "user.nk").write_bytes(seed)
    port = free_port()
    config = f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
    config += f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n'
    servers.append(start_configured_server(tmp_path / "srv", config, port))
    env = base_env(tmp_path, f"nats://127.0.0.1:{port}")
    scenario({**env, "FTRAIN_NATS_NKEY": str(tmp_path / "user.nk")})
    anonymous = ftrain_process(["list"], env)
    assert anonymous.returncode == 1 and "Authorization Violation" in anonymous.stderr
    unreadable = ftrain_process(["list"], {**env, "FTRAIN_NATS_NKEY": str(tmp_path / "nope.nk")})
    assert (unreadable.returncode, unreadable.stderr.count("\n")) == (2, 1)
    assert unreadable.stderr.startswith("ftrain list: error: FTRAIN_NATS_NKEY=")


@pytest.mark.parametrize("level", ["warning", "debug"])
def test_a_password_or_token_in_the_url_is_never_shown(
    tmp_path: Path, servers: list[subprocess.Popen[bytes]], level: str
) -> None:
    port = free_port()
    config = f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
    config += 'authorization { users = [ { user: "trainer", password: "s3cret" } ] }\n'
    servers.append(start_configured_server(tmp_path / "srv", config, port))
    env = {**base_env(tmp_path, f"nats://trainer:s3cret@127.0.0.1:{port}"), "FTRAIN_LOG_LEVEL": level}
    assert ftrain_process(["list"], env).returncode == 0  # credentials in the URL do sign in
    cases = {
        f"nats://trainer:wr0ngpass@127.0.0.1:{port}": "nats://trainer:***@127.0.0.1:",  # refused by the server
        f"nats://trainer:s3cret@127.0.0.1:{free_port()}": "nats://trainer:***@127.0.0.1:",  # nobody listening
        f"nats://t0kenvalue@127.0.0.1:{free_port()}": "nats://***@127.0.0.1:",
    }
    for url, shown in cases.items():
        status = ftrain_process(["status", "dist-P-1x2"], {**env, "FTRAIN_NATS_URL": url})
        assert status.returncode == 1
        assert status.stderr.splitlines()[-1].startswith(f"ftrain status: event log unreachable at {shown}")
        for secret in ("s3cret", "wr0ngpass", "t0kenvalue"):
            assert secret not in status.stderr + status.stdout
