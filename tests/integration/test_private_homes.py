"""A home is private under any umask and only ever ours: every directory ftrain makes on the way to a private
file is 0700, and a home (or keys/, nats/) that another uid owns, that others could write to, that is a link,
or that sits below a directory others could write to is refused, exit 2, one line naming it, nothing written.
Real CLI processes against a real nats-server; the second uid is made with chown (as root)."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from ftrain.events.signing import KEY_PREFIX, Signer
from ftrain.host.private_files import private_dir
from ftrain.projections.readmodel import ReadModel
from ftrain.workers.outbox import Outbox

NOBODY = 65534
UMASKS = [0o000, 0o002, 0o022]

AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another uid owns")


def ftrain(
    env: dict[str, str], *args: str, umask: int = 0o022, user: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """The real `ftrain` console script, run under `umask` (as `user`: a setpriv command line)."""
    script = str(Path(sys.executable).with_name("ftrain"))
    return subprocess.run(
        [*user, script, *args],
        env={**os.environ, **env}, umask=umask, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under `root` (and `root`): mode, owner and, for files, bytes."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = os.lstat(path)
        body = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        found[str(path.relative_to(root))] = (st.st_mode, st.st_uid, body)
    return found


def plant_keys(keys: Path) -> str:
    """An attacker's signing key and trust list in `keys` (made if missing); returns its public key line."""
    keys.mkdir(exist_ok=True)
    key = Ed25519PrivateKey.generate()
    (keys / "signing.key").write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    (keys / "signing.key").chmod(0o600)
    public = f"{KEY_PREFIX}{Signer(key).public_key}"
    (keys / "trusted").write_text(f"{public} root@vm\n")
    return public


def give_away(root: Path) -> None:
    """Make `root` and everything in it another uid's."""
    for path in [root, *root.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)


def assert_refused(done: subprocess.CompletedProcess[str], names: Path, *, planted: str = "") -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f" {names} " in done.stderr, done.stderr
    assert planted == "" or planted not in done.stdout + done.stderr


def chain(top: Path, leaf: Path) -> list[Path]:
    """`leaf` and every directory above it up to and excluding `top`."""
    return [p for p in (leaf, *leaf.parents) if top in p.parents]


@pytest.mark.parametrize("umask", UMASKS, ids=oct)
def test_every_directory_made_on_the_way_to_the_keys_is_0700_under_any_umask(
    env: dict[str, str], tmp_path: Path, umask: int
) -> None:
    home = tmp_path / "a" / "b" / "home"  # three directories to make, not one
    mirror = tmp_path / "m" / "mirror"
    env = {**env, "FTRAIN_HOME": str(home), "FTRAIN_ANCHOR_MIRROR": str(mirror)}
    done = ftrain(env, "keys", "init", umask=umask)
    assert done.returncode == 0, done.stderr
    made = chain(tmp_path, home / "keys")
    assert [oct(mode(p)) for p in made] == [oct(0o700)] * 4, made
    assert {p.name: oct(mode(p)) for p in (home / "keys").iterdir()} == {
        name: oct(0o600) for name in ("signing.key", "trusted", ".lock")
    }
    launched = ftrain(
        env, "launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--run-id", "r1", umask=umask
    )
    assert launched.returncode == 0, launched.stderr
    made = [*home.rglob("*"), *chain(tmp_path, mirror), *mirror.iterdir()]
    loose = {str(p): oct(mode(p)) for p in made if mode(p) != (0o700 if p.is_dir() else 0o600)}
    assert any(home.glob("anchors*.log")) and any(mirror.glob("anchors*.log")) and loose == {}


@pytest.mark.parametrize("umask", UMASKS, ids=oct)
def test_the_embedded_server_directory_is_0700_with_every_parent_under_any_umask(
    tmp_path: Path, umask: int
) -> None:
    home = tmp_path / "x" / "home"
    env = {"FTRAIN_HOME": str(home), "FTRAIN_NATS_URL": "", "FTRAIN_NATS_NKEY": "", "FTRAIN_STORAGE": ""}
    try:
        done = ftrain(env, "server", "start", umask=umask)
        assert done.returncode == 0, done.stderr
    finally:
        ftrain(env, "server", "stop")
    assert [oct(mode(p)) for p in chain(tmp_path, home / "nats" / "store")] == [oct(0o700)] * 4
    files = [p for p in (home / "nats").iterdir() if p.is_file()]
    assert files and {oct(mode(p)) for p in files} == {oct(0o600)}


@pytest.mark.parametrize("umask", UMASKS, ids=oct)
async def test_the_outbox_and_read_model_directories_are_made_0700_under_any_umask(
    tmp_path: Path, umask: int
) -> None:
    previous = os.umask(umask)
    try:
        outbox = Outbox(tmp_path / "o" / "home" / "outbox.sqlite")
        model = await ReadModel.open(tmp_path / "m" / "home" / "readmodel.sqlite")
        outbox.close()
        await model.close()
    finally:
        os.umask(previous)
    for top in ("o", "m"):
        assert [mode(p) for p in chain(tmp_path, tmp_path / top / "home")] == [0o700, 0o700]


@needs_root
@pytest.mark.parametrize("home_mode", [0o700, 0o777], ids=oct)
@pytest.mark.parametrize("command", [("keys", "init"), ("keys", "show"), ("list",)])
def test_a_home_another_user_made_is_refused_and_nothing_is_written(
    env: dict[str, str], home_mode: int, command: tuple[str, ...]
) -> None:
    home = Path(env["FTRAIN_HOME"])
    home.mkdir()
    planted = plant_keys(home / "keys")
    give_away(home)
    home.chmod(home_mode)
    before = snapshot(home)
    done = ftrain(env, *command)
    assert_refused(done, home, planted=planted)
    assert f"owned by uid {NOBODY}, not this user (uid {os.getuid()})" in done.stderr
    assert snapshot(home) == before, "never adopted, never chmod-ed into use"


@needs_root
def test_a_keys_directory_another_user_owns_inside_our_home_is_refused(env: dict[str, str]) -> None:
    home = Path(env["FTRAIN_HOME"])
    private_dir(home)
    planted = plant_keys(home / "keys")
    give_away(home / "keys")
    (home / "keys").chmod(0o755)
    before = snapshot(home)
    for command in (("keys", "show"), ("keys", "init"), ("list",)):
        assert_refused(ftrain(env, *command), home / "keys", planted=planted)
    assert snapshot(home) == before


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to act as another user")
def test_another_user_given_a_home_root_made_is_refused_in_one_line_not_stopped_by_eperm() -> None:
    home = Path(tempfile.mkdtemp(dir="/tmp", prefix="ftrain-home-"))  # where uid 65534 can reach it
    try:
        home.chmod(0o777)
        env = {"FTRAIN_HOME": str(home), "FTRAIN_NATS_URL": "", "FTRAIN_NATS_NKEY": "", "FTRAIN_STORAGE": ""}
        for command in (("list",), ("keys", "init"), ("keys", "show")):  # list: EPERM from chmod, before
            done = ftrain(env, *command, user=AS_NOBODY)
            assert_refused(done, home)
            assert f"owned by uid 0, not this user (uid {NOBODY})" in done.stderr
        assert (mode(home), list(home.iterdir())) == (0o777, [])
    finally:
        shutil.rmtree(home)


@pytest.mark.parametrize("loose", [0o777, 0o775, 0o757], ids=oct)
def test_a_home_of_ours_others_could_write_to_is_refused_with_what_to_do(
    env: dict[str, str], loose: int
) -> None:
    home = Path(env["FTRAIN_HOME"])
    home.mkdir()
    home.chmod(loose)
    planted = plant_keys(home / "keys")  # what another user could have put there meanwhile
    before = snapshot(home)
    done = ftrain(env, "keys", "show")
    assert_refused(done, home, planted=planted)
    assert f"writable by group or others (mode {loose:o})" in done.stderr and "chmod 700" in done.stderr
    assert snapshot(home) == before, "left as it is for its owner to check"
    shutil.rmtree(home / "keys")  # what its owner finds on checking it
    home.chmod(0o700)
    done = ftrain(env, "keys", "show")
    assert done.returncode == 0 and planted not in done.stdout


def test_a_home_below_a_directory_others_can_write_to_is_refused_unless_it_is_sticky(
    env: dict[str, str], tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {**env, "FTRAIN_HOME": str(shared / "me" / "home")}
    done = ftrain(env, "keys", "init")
    assert_refused(done, shared)
    assert "writable by group or others (mode 777)" in done.stderr
    assert list(shared.iterdir()) == [], "nothing made below it"
    shared.chmod(0o1777)  # like /tmp: others cannot move our entry
    assert ftrain(env, "keys", "init").returncode == 0
    assert mode(shared / "me") == mode(shared / "me" / "home") == 0o700


def test_a_home_that_is_a_link_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    Path(env["FTRAIN_HOME"]).symlink_to(elsewhere)
    done = ftrain(env, "keys", "init")
    assert_refused(done, Path(env["FTRAIN_HOME"]))
    assert "symbolic link" in done.stderr and list(elsewhere.iterdir()) == []
