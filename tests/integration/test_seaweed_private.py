"""The embedded SeaweedFS is private to its user: another local uid, trying every socket the weed process
listens on (found from /proc, not from ftrain's record) with HTTP GET and PUT, a TLS handshake without a client
certificate and a plaintext HTTP/2 (gRPC) preface, gets nothing anywhere but from the S3 port, and there only
with a request signed with the store's keys; the owner's S3 clients work unchanged; an older ftrain's open
server is replaced, not reused."""

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from ftrain.workers.s3.seaweed_server import (
    REGION,
    SeaweedProcess,
    ensure_storage_server,
    read_record,
    seaweed_dir,
    throwaway_storage_server,
)

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SECRET = b"checkpoint bytes only the owner may read"

# Stdlib only, so it runs as another uid. argv[1]: JSON {"endpoints": [[kind, where], ...], "s3": port,
# "object": "/bucket/key", "signed": {headers}}. Prints JSON: per endpoint, per attempt, what came back.
PROBE = r"""
import json, socket, ssl, sys
arg = json.loads(sys.argv[1])
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

def connect(kind, where):
    if kind == "tcp":
        return socket.create_connection(("127.0.0.1", where), timeout=3)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(where)
    return s

def read_all(s):
    data = b""
    try:
        while len(data) < 65536:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, socket.timeout):
        pass
    return data

def http(kind, where, method, path, headers=None, body=b"", tls=False):
    try:
        s = connect(kind, where)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            s = ctx.wrap_socket(s)
        host = f"127.0.0.1:{where}" if kind == "tcp" else "localhost"  # as signed
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        s.sendall((head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        data = read_all(s)
        s.close()
    except Exception as exc:
        return {"error": type(exc).__name__}
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.partition(b"\r\n")[0]
    return {"status": status.decode(errors="replace"), "body": body[:200].decode(errors="replace")}

def h2(kind, where):
    try:
        s = connect(kind, where)
        s.sendall(H2_PREFACE)
        data = read_all(s)
        s.close()
    except Exception as exc:
        return {"error": type(exc).__name__}
    return {"settings": len(data) >= 9 and data[3] == 4, "head": data[:40].decode(errors="replace")}

out = {}
for kind, where in arg["endpoints"]:
    got = {}
    filer = "/buckets" + arg["object"]  # the object as the filer names it
    for path in ("/", arg["object"], filer, "/dir/assign", "/cluster/status", "/vol/status", "/status"):
        got["GET " + path] = http(kind, where, "GET", path)
    for path in (arg["object"], filer):
        got["PUT " + path] = http(kind, where, "PUT", path, body=b"planted")
    got["TLS GET " + arg["object"]] = http(kind, where, "GET", arg["object"], tls=True)
    got["h2c"] = h2(kind, where)
    if kind == "tcp" and where == arg["s3"]:
        got["signed GET"] = http(kind, where, "GET", arg["object"], headers=arg["signed"])
    out[f"{kind}:{where}"] = got
print(json.dumps(out))
"""

HTTPS_ONLY = "400 Bad Request"  # Go's answer to plain HTTP on a TLS port, and nothing more
HTTPS_ONLY_BODY = "Client sent an HTTP request to an HTTPS server."


def _require_second_uid() -> None:
    """Skip (or, with FTRAIN_REQUIRE_NETNS=1 as in CI, fail) unless we can act as another uid."""
    why = None
    if os.geteuid() != 0:
        why = "not root: cannot act as another uid"
    elif shutil.which("setpriv") is None or not Path("/usr/bin/python3").exists():
        why = "needs setpriv and a system python3 to act as another user"
    if why is None:
        return
    if os.environ.get("FTRAIN_REQUIRE_NETNS") == "1":
        pytest.fail(f"second-uid tests required (FTRAIN_REQUIRE_NETNS=1) but {why}")
    pytest.skip(why)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening(pid: int) -> list[tuple[str, int | str]]:
    """Every TCP port and Unix socket `pid` listens on, from /proc (relative socket paths resolved)."""
    inodes, found = _socket_inodes(pid), list[tuple[str, int | str]]()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                found.append(("tcp", int(cols[1].rsplit(":", 1)[1], 16)))
    cwd = os.readlink(f"/proc/{pid}/cwd")
    for row in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        cols = row.split()
        if len(cols) == 8 and cols[6] in inodes and int(cols[3], 16) & 0x10000:  # __SO_ACCEPTCON
            found.append(("unix", os.path.join(cwd, cols[7])))
    return sorted(set(found), key=str)


def _signed_headers(proc: SeaweedProcess, url: str) -> dict[str, str]:
    """A GET of `url` signed with the store's keys, by the owner, for the other uid to send."""
    request = AWSRequest(method="GET", url=url)
    S3SigV4Auth(Credentials(proc.access_key, proc.secret_key), "s3", REGION).add_auth(request)
    return {k: str(v) for k, v in request.headers.items()}


def probe(arg: dict[str, Any], *, as_nobody: bool) -> dict[str, dict[str, Any]]:
    """Run PROBE (as uid 65534, or as we are) on `arg`: what each endpoint answered to each attempt."""
    argv = [*(NOBODY if as_nobody else []), "/usr/bin/python3", "-I", "-c", PROBE, json.dumps(arg)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return result


def _refused(answer: dict[str, Any]) -> bool:
    """Nothing of the service came back: no connection, a TLS failure, or Go's bare 'this port is HTTPS'."""
    if "error" in answer or answer.get("settings") is False:
        return True
    status = answer.get("status", "")
    return status == "" or (HTTPS_ONLY in status and answer.get("body", "").strip() == HTTPS_ONLY_BODY)


def test_another_uid_reaches_nothing_but_signed_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _require_second_uid()
    with throwaway_storage_server(tmp_path, bucket="ftrain") as proc:
        for name, value in proc.env().items():
            monkeypatch.setenv(name, value)
        owner = boto3.client("s3")  # the owner's ordinary client: the AWS profile files, nothing else
        owner.put_object(Bucket="ftrain", Key="r1/state.json", Body=SECRET)
        assert owner.get_object(Bucket="ftrain", Key="r1/state.json")["Body"].read() == SECRET
        ranged = owner.get_object(Bucket="ftrain", Key="r1/state.json", Range="bytes=0-9")
        assert ranged["Body"].read() == SECRET[:10]

        endpoints = listening(proc.pid)
        ports = {where for kind, where in endpoints if kind == "tcp"}
        assert set(proc.ports) <= ports and len(ports) >= 8, endpoints  # 4 services, HTTP and gRPC each
        arg = {
            "endpoints": endpoints,
            "s3": proc.s3_port,
            "object": "/ftrain/r1/state.json",
            "signed": _signed_headers(proc, f"{proc.endpoint}/ftrain/r1/state.json"),
        }
        seen = probe(arg, as_nobody=True)
        s3 = seen.pop(f"tcp:{proc.s3_port}")
        assert s3["signed GET"]["status"] == "HTTP/1.1 200 OK" and s3["signed GET"]["body"] == SECRET.decode()
        for attempt in ("GET /ftrain/r1/state.json", "PUT /ftrain/r1/state.json"):
            assert s3[attempt]["status"] == "HTTP/1.1 403 Forbidden", s3[attempt]
            assert SECRET.decode() not in s3[attempt]["body"]
        opened = {(where, attempt): answer for where, got in seen.items() for attempt, answer in got.items()}
        assert {k: v for k, v in opened.items() if not _refused(v)} == {}
        # weed's sockets in /tmp are made with the umask's mode (0777 under umask 000): they must not rest on
        # it, and refuse even a client that may connect (root) unless it holds the certificate
        outside = [e for e in endpoints if e[0] == "unix" and not str(e[1]).startswith(f"{tmp_path}/")]
        assert outside, endpoints
        as_root = probe({**arg, "endpoints": outside}, as_nobody=False)
        got = {(where, attempt): answer for where, got in as_root.items() for attempt, answer in got.items()}
        assert {k: v for k, v in got.items() if not _refused(v)} == {}
        assert owner.get_object(Bucket="ftrain", Key="r1/state.json")["Body"].read() == SECRET  # not replaced
        listed = owner.list_objects_v2(Bucket="ftrain")["Contents"]
        assert [o["Key"] for o in listed] == ["r1/state.json"]


def test_the_keys_are_private_kept_across_restarts_and_an_open_server_is_replaced(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with throwaway_storage_server(home) as first:
        directory = seaweed_dir(home)
        kept = ["security.toml", "jwt", "tls/ca.pem", "tls/cert.pem", "tls/key.pem"]
        for name in kept:
            assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE((directory / "tls").stat().st_mode) == 0o700
        before = {name: (directory / name).read_bytes() for name in kept}
        record = json.loads((directory / "server.json").read_bytes())
        del record["private"]  # as an older ftrain recorded its open server
        (directory / "server.json").write_text(json.dumps(record))
        second = ensure_storage_server(home)
        assert second.pid != first.pid and second.private and read_record(directory) == second
        assert {name: (directory / name).read_bytes() for name in kept} == before
