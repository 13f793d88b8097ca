"""`ftrain ui` over HTTP against a real nats-server: nothing without the token (401, one log line), the token
accepted once in the URL and then as an HttpOnly, SameSite=Strict cookie or a bearer header, an unknown run a
404 page, hostile event text escaped, no write path, the page's policy allowing no inline script, and each
node's memory snapshot part with its replica as `status` shows it."""

import http.client
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.service import RunService
from tests.integration.test_failures import checkpoint, launch
from tests.integration.test_snapshot_replicas import NODE_ROWS, record_snapshot
from tests.integration.test_terminal_text import hostile_log
from tests.support.processes import ftrain_process, modules_imported_by
from tests.support.servers import stream_last_seq
from tests.support.ui_server import Ui, serving

SCRIPTED = "<script>document.title='pwned'</script>\"'<img src=x onerror=alert(1)>\u202e\x1b[31m&amp;"


def get(ui: Ui, path: str, *, token: bool = True, method: str = "GET") -> tuple[int, dict[str, str], str]:
    """One request; with `token`, as a bearer header."""
    conn = http.client.HTTPConnection(urlsplit(ui.base).netloc, timeout=30)
    conn.request(method, path, headers={"Authorization": f"Bearer {ui.token}"} if token else {})
    reply = conn.getresponse()
    body = reply.read().decode()
    conn.close()
    return reply.status, {k.lower(): v for k, v in reply.getheaders()}, body


@pytest.fixture
async def log(app: RunService, server: ServerProcess) -> None:
    await launch(app, "plain")
    await checkpoint(app, "plain", 10)
    await app.fail("plain", reason="oom", exit_code=137, message=SCRIPTED)
    await hostile_log(app, server)


@pytest.mark.usefixtures("log")
async def test_nothing_is_served_without_the_token_and_each_refusal_is_one_log_line(
    env: dict[str, str], server: ServerProcess
) -> None:
    with serving(env) as ui:
        for path in ("/", "/runs/plain", "/static/ui.js", "/metrics", "/live", "/nowhere"):
            status, headers, body = get(ui, path, token=False)
            assert status == 401, path
            assert "plain" not in body and "<html" not in body
            assert "set-cookie" not in headers
        status, _, _ = get(ui, f"/?token={ui.token}x", token=False)
        assert status == 401
        conn = http.client.HTTPConnection(urlsplit(ui.base).netloc, timeout=30)
        conn.request("GET", "/", headers={"Cookie": "ftrain_ui_x=" + ui.token, "Authorization": "Basic Zm9v"})
        assert conn.getresponse().status == 401
        conn.close()
    assert ui.returncode == 0, ui.stderr
    refusals = [line for line in ui.stderr.splitlines() if "refused" in line]
    assert len(refusals) == 8, ui.stderr
    assert all(json.loads(line)["status"] == 401 for line in refusals)
    assert ui.token not in ui.stderr


@pytest.mark.usefixtures("log")
async def test_the_token_once_in_the_url_becomes_a_strict_http_only_cookie(env: dict[str, str]) -> None:
    with serving(env) as ui:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        conn = http.client.HTTPConnection(urlsplit(ui.base).netloc, timeout=30)
        conn.request("GET", f"/runs/plain?token={ui.token}&all=1")
        reply = conn.getresponse()
        assert reply.status == 303
        assert reply.getheader("Location") == "/runs/plain?all=1"  # the token leaves the address bar
        cookie = reply.getheader("Set-Cookie") or ""
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and ui.token in cookie
        conn.close()
        with opener.open(ui.url, timeout=30) as page:
            assert page.status == 200 and page.url == ui.base + "/"
            assert "plain" in page.read().decode()
        with opener.open(ui.base + "/runs/plain", timeout=30) as page:  # the cookie alone now
            assert page.status == 200


@pytest.mark.usefixtures("log")
async def test_pages_escape_event_text_carry_a_strict_policy_and_an_unknown_run_is_a_404_page(
    env: dict[str, str],
) -> None:
    with serving(env) as ui:
        status, headers, body = get(ui, "/runs/plain")
        assert status == 200
        policy = headers["content-security-policy"]
        assert (
            "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy
        )
        assert headers["x-content-type-options"] == "nosniff"
        assert (
            "<script>document" not in body
            and "<img" not in body
            and "\u202e" not in body
            and "\x1b" not in body
        )
        assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;&quot;" in body
        assert r"\u202e\x1b[31m&amp;amp;" in body  # shown as escapes; the entity shown as typed
        assert re.findall(r"<script[^>]*>", body) == ['<script src="/static/ui.js" defer>']
        assert " on" not in re.sub(r"<td[^>]*>.*?</td>", "", body).lower().replace("onclick", "")
        for run in ("victim", "ghost", "linkbreak"):
            status, _, body = get(ui, f"/runs/{run}")
            assert status == 200
            assert "\x1b" not in body and "\u202e" not in body and "\n#9" not in body
            assert 'class="verdict bad"' in body
        status, headers, body = get(ui, "/runs/no-such-run")
        assert status == 404 and headers["content-type"].startswith("text/html")
        assert "unknown run &#x27;no-such-run&#x27;" in body
        status, _, body = get(ui, "/runs/%3Cscript%3E")
        assert status == 404 and "<script>" not in body.replace('<script src="/static/ui.js" defer>', "")
        for seq in ("999999", "%D9%A3", "9" * 5000, "-1"):  # none there, not ASCII, too long, not a number
            assert get(ui, f"/runs/plain/events/{seq}")[0] == 404, seq
        for wildcard in ("*", "%3E", "plain.*"):  # a run name is never a subject filter over other runs
            assert get(ui, f"/runs/{wildcard}/events/1")[0] == 404, wildcard
        assert get(ui, "/nowhere")[0] == 404


async def test_a_run_page_shows_each_nodes_snapshot_part_and_its_replica(
    app: RunService, env: dict[str, str]
) -> None:
    await record_snapshot(app, env, "mem")
    with serving(env) as ui:
        status, _, body = get(ui, "/runs/mem")
    assert status == 200
    memory = re.search(r"<h2>Memory snapshot</h2>.*?</section>", body)
    assert memory is not None
    rows = [
        [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr class=.*?</tr>", memory.group())
    ]
    assert rows == NODE_ROWS


@pytest.mark.usefixtures("log")
async def test_metrics_are_served_behind_the_same_token(env: dict[str, str]) -> None:
    with serving(env) as ui:
        assert get(ui, "/metrics", token=False)[0] == 401
        status, headers, body = get(ui, "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain"), body[:300]
        assert re.search(r'^ftrain_\w+\{[^}]*run_id="plain"', body, re.M), body[:2000]
        assert "<script>" not in body


@pytest.mark.usefixtures("log")
async def test_there_is_no_write_path(env: dict[str, str], server: ServerProcess) -> None:
    before = await stream_last_seq(server)
    with serving(env) as ui:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, _, _ = get(ui, "/runs/plain", method=method)
            assert status == 501, method
        for path in ("/", "/runs/plain", "/runs/victim", "/runs/plain/events/1", "/static/ui.css"):
            assert get(ui, path)[0] == 200, path
    assert await stream_last_seq(server) == before


async def test_the_live_stream_says_the_stream_sequence_as_it_grows(
    env: dict[str, str], app: RunService, server: ServerProcess
) -> None:
    await launch(app, "growing")
    with serving(env) as ui:
        conn = http.client.HTTPConnection(urlsplit(ui.base).netloc, timeout=30)
        conn.request("GET", "/live", headers={"Authorization": f"Bearer {ui.token}"})
        reply = conn.getresponse()
        assert reply.getheader("Content-Type") == "text/event-stream"
        assert reply.fp.readline() == f"data: {await stream_last_seq(server)}\n".encode()
        reply.fp.readline()
        await checkpoint(app, "growing", 10)
        assert reply.fp.readline() == f"data: {await stream_last_seq(server)}\n".encode()
        conn.close()


def test_a_malformed_port_an_existing_socket_or_a_port_in_use_is_refused_with_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    taken = tmp_path / "taken.sock"
    taken.write_text("")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        for args, code, said in (
            (["ui", "--port", "70000"], 2, "is not a port"),
            (["ui", "--socket", str(taken)], 2, "exists"),
            (["ui", "--port", str(busy.getsockname()[1])], 1, "ftrain ui: Address already in use"),
        ):
            result = ftrain_process(args, env)
            assert (result.returncode, result.stdout, result.stderr.count("\n")) == (code, "", 1), (
                result.stderr
            )
            assert said in result.stderr


def test_only_ui_loads_the_web_stack_and_it_never_loads_torch() -> None:
    others = modules_imported_by(
        {"ftrain.cli.main", "ftrain.cli.commands", "ftrain.cli.queries", "ftrain.service"}
    )
    assert not {m for m in others if m.startswith("ftrain.web") or m in ("http.server", "socketserver")}
    ui = modules_imported_by(
        {"ftrain.cli.ui_cmd", "ftrain.web.server", "ftrain.web.reader", "ftrain.web.pages"}
    )
    assert not {m for m in ui if m.partition(".")[0] == "torch"}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self.path))


@pytest.mark.usefixtures("log")
def test_on_a_unix_socket_the_view_is_its_users_only_and_still_wants_the_token(
    env: dict[str, str], tmp_path: Path
) -> None:
    where = tmp_path / "ui.sock"
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ftrain")), "ui", "--socket", str(where)],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        token = proc.stdout.readline().strip().partition("?token=")[2]
        assert token and stat.S_IMODE(where.stat().st_mode) == 0o600
        for headers, status in (({}, 401), ({"Authorization": f"Bearer {token}"}, 200)):
            conn = _UnixConnection(where)
            conn.request("GET", "/runs/plain", headers=headers)
            assert conn.getresponse().status == status
            conn.close()
        conn = _UnixConnection(where)
        conn.request("GET", f"//elsewhere.example/?token={token}")
        assert conn.getresponse().getheader("Location") == "/elsewhere.example/"
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    assert proc.returncode == 0 and not where.exists()
