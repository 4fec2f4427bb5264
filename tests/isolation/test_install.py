"""``openenv-gym install`` from local bare git repositories, folders and a wheel: consent first, pinned after.

Venvs are not built here (``--no-build``; the builds are in ``test_venv_builds.py``): what is
checked is what the user relies on before a build: nothing fetched runs or is recorded without
consent, the commit is pinned, secrets never reach the data dir, credentials never reach output.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from openenv_gym.cli import main
from openenv_gym.errors import ConfigurationError
from openenv_gym.importers.catalog import load_catalog
from openenv_gym.install import install, strip_credentials
from openenv_gym.registration import register_catalog

sys.path.insert(0, str(Path(__file__).parent))
from isolation_envs import one_tool_env  # noqa: E402

ENVS = Path(__file__).resolve().parents[1] / "envs"
TOKEN = "ghp_fake0123456789secretTOKEN"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"]

def call(name: str) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": "{}"}}]}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


class Repo:
    """A work tree pushing to a bare repository, as a user's remote would be."""

    def __init__(self, root: Path):
        self.work, self.bare = root / "work", root / "remote.git"
        self.work.mkdir()
        git("init", "--bare", "--quiet", str(self.bare), cwd=root)
        git("init", "--quiet", cwd=self.work)
        git("remote", "add", "origin", str(self.bare), cwd=self.work)

    def commit(self, files: dict[str, str], message: str) -> str:
        for rel, text in files.items():
            (self.work / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.work / rel).write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "--quiet", "-m", message, cwd=self.work)
        git("push", "--quiet", "origin", "HEAD:main", "--tags", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)

    @property
    def url(self) -> str:
        return f"git+file://{self.bare}"


def version(n: int) -> str:
    """Version ``n`` of the installed env: its one tool is called ``v<n>``."""
    return one_tool_env("Tiny", f"v{n}", repr(f"v{n}"))


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENENV_GYM_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def repo(tmp_path):
    r = Repo(tmp_path)
    r.first = r.commit({"env.py": version(1), ".env": f"GITHUB_TOKEN={TOKEN}\n",
                        "keys/id_rsa": f"-----BEGIN OPENSSH PRIVATE KEY----- {TOKEN}\n",
                        "data/tasks.jsonl": '{"id": 0}\n', "requirements.txt": "tabulate>=0.9\n"}, "v1")
    return r


def tools_of(env_id: str) -> set[str]:
    env = gym.make(env_id, isolate=False)  # plays the snapshot in this process: no venv needed
    try:
        _, info = env.reset(seed=0)
        return {t["function"]["name"] for t in info["tools"]}
    finally:
        env.close()


def all_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_without_a_terminal_and_without_yes_nothing_is_installed(repo, tmp_path, data_dir):
    env = {**os.environ, "OPENENV_GYM_DATA": str(data_dir)}
    done = subprocess.run([sys.executable, "-m", "openenv_gym.cli", "install", repo.url, "--name", "Tiny", "--no-build"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "--yes" in done.stderr and "not installed" in done.stderr
    # the plan was shown: what would run, its requirements, the commit, what is left out
    for shown in ("ors environment Tiny", "tabulate>=0.9", repo.first, ".env (may hold a secret)", "keys/id_rsa"):
        assert shown in done.stdout
    assert not Path(os.environ["OPENENV_GYM_CATALOG"]).exists() or "Tiny" not in load_catalog()
    assert not (data_dir / "sources").exists()


def test_a_no_at_the_prompt_installs_nothing_and_a_yes_installs(repo, data_dir):
    with pytest.raises(ConfigurationError, match="no consent"):
        install(repo.url, "Tiny", ask=lambda question: "n", show=lambda text: None, build=False)
    assert "Tiny" not in load_catalog() and not (data_dir / "sources").exists()
    asked = []
    entry = install(repo.url, "Tiny", ask=lambda question: asked.append(question) or "y", show=lambda text: None,
                    build=False)
    assert asked == ["install Tiny? [y/N] "] and entry.commit == repo.first


def test_yes_pins_the_commit_and_the_repo_moving_on_changes_nothing_until_a_reinstall(repo, capsys, data_dir):
    assert main(["install", repo.url, "--name", "Tiny", "--yes", "--no-build"]) == 0
    out = capsys.readouterr().out
    assert f"at commit {repo.first}" in out
    entry = load_catalog()["Tiny"]
    assert (entry.commit, entry.origin, entry.kind) == (repo.first, repo.url, "ors")
    assert Path(entry.source).is_relative_to(data_dir) and "tabulate>=0.9" in entry.isolated.requirements
    assert {".env (may hold a secret)", "keys/id_rsa (may hold a secret)"} <= set(entry.isolated.excluded)
    # secrets never landed: not as files, not as text anywhere in the data dir or the catalog
    assert (Path(entry.source) / "data" / "tasks.jsonl").is_file() and not (Path(entry.source) / ".env").exists()
    assert TOKEN not in all_text(data_dir) and TOKEN not in Path(os.environ["OPENENV_GYM_CATALOG"]).read_text()
    register_catalog()
    assert gym.spec("openenv/Tiny-v0").kwargs["isolate"] is True
    assert tools_of("openenv/Tiny-v0") == {"v1"}
    second = repo.commit({"env.py": version(2)}, "v2")
    register_catalog()
    assert tools_of("openenv/Tiny-v0") == {"v1"}  # pinned: still the installed commit
    assert main(["install", repo.url, "--name", "Tiny", "--yes", "--no-build"]) == 0
    register_catalog()
    assert load_catalog()["Tiny"].commit == second and tools_of("openenv/Tiny-v0") == {"v2"}


def test_a_rev_and_a_subdirectory_pick_what_is_installed(tmp_path):
    r = Repo(tmp_path)
    first = r.commit({"envs/tiny/env.py": version(1), "README.md": "envs\n"}, "v1")
    git("tag", "v1.0", cwd=r.work)
    r.commit({"envs/tiny/env.py": version(2)}, "v2")
    entry = install(f"{r.url}@v1.0#subdirectory=envs/tiny", "Tagged", yes=True, show=lambda text: None, build=False)
    assert entry.commit == first and entry.origin.endswith("@v1.0#subdirectory=envs/tiny")
    assert sorted(p.name for p in Path(entry.source).iterdir()) == ["env.py"]
    register_catalog()
    assert tools_of("openenv/Tagged-v0") == {"v1"}
    with pytest.raises(ConfigurationError, match="inside the repository"):
        install(f"{r.url}#subdirectory=../..", "Escape", yes=True, show=lambda text: None, build=False)


def test_credentials_in_a_url_are_never_shown_or_recorded(capsys):
    assert strip_credentials("git+https://user:s3cret@host.example/org/repo.git@v1#subdirectory=a") == \
        "git+https://host.example/org/repo.git@v1#subdirectory=a"
    with socket.socket() as s:  # a port nothing listens on: the clone fails at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "s3cret-" + TOKEN
    code = main(["install", f"git+https://user:{secret}@127.0.0.1:{port}/org/repo.git", "--name", "Cred", "--yes"])
    captured = capsys.readouterr()
    assert code == 2 and "failed" in captured.err
    assert secret not in captured.err + captured.out and "127.0.0.1" in captured.err


def write_wheel(folder: Path, name: str, version_: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel, zipped by hand (what a build backend would write)."""
    import zipfile

    dist = f"{name.replace('-', '_')}-{version_}"
    meta = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version_}\n",
            f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    everything = {**files, **meta}
    everything[f"{dist}.dist-info/RECORD"] = "".join(f"{k},,\n" for k in everything) + f"{dist}.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for rel, text in everything.items():
            z.writestr(rel, text)
    return wheel


def write_sdist(folder: Path, name: str, version_: str, marker: Path) -> None:
    """An sdist whose setup.py would leave ``marker`` behind if anything ran it."""
    import io
    import tarfile

    setup = f"open({str(marker)!r}, 'w').write('ran')\nfrom setuptools import setup\nsetup(name={name!r}, version={version_!r})\n"
    with tarfile.open(folder / f"{name}-{version_}.tar.gz", "w:gz") as t:
        data = setup.encode()
        info = tarfile.TarInfo(f"{name}-{version_}/setup.py")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))


def test_a_requirement_is_installed_from_its_wheel_and_an_sdist_is_never_built(tmp_path, monkeypatch):
    wheels = tmp_path / "index"
    write_wheel(wheels, "tiny-env", "0.3", {"tiny_env/__init__.py": version(7)})
    marker = tmp_path / "setup-py-ran"
    write_sdist(wheels, "sdist-only", "0.1", marker)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the local index, never the network
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    entry = install("tiny-env==0.3", "TinyPkg", yes=True, show=lambda text: None, build=False)
    assert entry.origin == "tiny-env==0.3" and entry.commit is None
    assert entry.isolated.requirements[0] == "tiny-env==0.3"  # the venv installs the package itself
    register_catalog()
    assert tools_of("openenv/TinyPkg-v0") == {"v7"}
    with pytest.raises(ConfigurationError, match="as a wheel"):
        install("sdist-only==0.1", "Sdist", yes=True, show=lambda text: None, build=False)
    assert not marker.exists() and "Sdist" not in load_catalog()
    with pytest.raises(ConfigurationError, match="as a wheel"):
        install("tiny-env==9.9", "Missing", yes=True, show=lambda text: None, build=False)


def test_a_local_folder_records_its_clean_commit(repo, tmp_path):
    entry = install(str(repo.work), "Local", yes=True, show=lambda text: None, build=False)
    assert entry.commit == repo.first and entry.origin == str(repo.work)
    (repo.work / "env.py").write_text(version(3))  # an uncommitted edit: no commit to pin
    again = install(str(repo.work), "Local", yes=True, show=lambda text: None, build=False)
    assert again.commit is None
    shutil.rmtree(repo.work)  # the original is gone: the snapshot plays on
    register_catalog()
    assert tools_of("openenv/Local-v0") == {"v3"}


# -- credentials: on no command line, in no message -----------------------------------------------
class GitOverHttp:
    """``bare`` served over git's dumb HTTP protocol on 127.0.0.1, behind HTTP Basic auth.

    While an authorised request is being answered, git's processes are alive: the handler then
    reads the command line of every descendant of this test (``/proc/PID/cmdline``).
    """

    def __init__(self, bare: Path, user: str, password: str):
        import base64
        import functools
        import http.server
        import threading

        from openenv_gym.testing import procs

        git("update-server-info", cwd=bare)
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.requests: list[tuple[str, bool]] = []
        self.command_lines: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                authorised = self.headers.get("Authorization") == expected
                outer.requests.append((self.path, authorised))
                if not authorised:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="repo"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if not outer.command_lines:
                    outer.command_lines = [procs.cmdline(p) for p in procs.descendants()]
                super().do_GET()

            def log_message(self, *args):
                pass

        handler = functools.partial(Handler, directory=str(bare.parent))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"127.0.0.1:{self.server.server_address[1]}/{bare.name}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_url_credentials_reach_git_through_its_environment_and_never_a_command_line(repo, capsys):
    user, password = "oauth2", f"p@ss:{TOKEN}/x?y#z"  # "@", ":", "/", "?", "#": all percent-encoded in the URL
    from urllib.parse import quote

    served = GitOverHttp(repo.bare, user, password)
    try:
        url = f"git+http://{user}:{quote(password, safe='')}@{served.url}"
        assert main(["install", url, "--name", "Cred", "--yes", "--no-build"]) == 0
    finally:
        served.close()
    out = capsys.readouterr()
    # git asked, was refused, then sent the credentials the helper gave it: the clone happened
    assert (False in {a for _, a in served.requests}) and (True in {a for _, a in served.requests})
    assert load_catalog()["Cred"].commit == repo.first
    # while the clone ran, git's HTTP helper was alive, and no command line held the password
    assert any("remote-http" in line and served.url.split("/")[0] in line for line in served.command_lines)
    leaks = [line for line in served.command_lines if TOKEN in line or quote(password, safe="") in line]
    assert leaks == []
    assert TOKEN not in out.out + out.err and load_catalog()["Cred"].origin == f"git+http://{served.url}"
    assert TOKEN not in Path(os.environ["OPENENV_GYM_CATALOG"]).read_text()


def test_a_wrong_password_fails_and_is_never_shown(repo, capsys):
    served = GitOverHttp(repo.bare, "oauth2", "right")
    try:
        assert main(["install", f"git+http://oauth2:{TOKEN}@{served.url}", "--name", "Wrong", "--yes",
                     "--no-build"]) == 2
    finally:
        served.close()
    err = capsys.readouterr().err
    assert "failed" in err and TOKEN not in err and served.url in err and len(err.strip().splitlines()) == 1


def test_the_credential_helper_answers_only_its_own_host():
    from openenv_gym.install import _git_env, _without_credentials

    url = _without_credentials("https://u:secret@127.0.0.1:1234/org/repo.git")
    assert url.url == "https://127.0.0.1:1234/org/repo.git"

    def fill(request: str) -> str:
        return subprocess.run(["git", "credential", "fill"], input=request, capture_output=True, text=True,
                              env=_git_env(url.env), timeout=30).stdout

    assert "password=secret" in fill("protocol=https\nhost=127.0.0.1:1234\n\n")
    assert "secret" not in fill("protocol=https\nhost=127.0.0.2:1234\n\n")  # a redirect elsewhere gets nothing
    assert "secret" not in fill("protocol=http\nhost=127.0.0.1:1234\n\n")   # nor a downgrade to http


def closed_port() -> int:
    """A port nothing listens on: a clone from it fails at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_password_with_an_at_sign_never_reaches_the_output(capsys):
    port = closed_port()
    assert strip_credentials(f"https://u:head@tail-{TOKEN}@127.0.0.1/x") == "https://127.0.0.1/x"
    assert main(["install", f"git+https://user:head@tail-{TOKEN}@127.0.0.1:{port}/org/repo.git", "--name", "At",
                 "--yes"]) == 2
    err = capsys.readouterr().err
    assert "127.0.0.1" in err and "tail" not in err and TOKEN not in err


def test_a_token_in_the_query_is_refused_and_never_shown(capsys):
    port = closed_port()
    for query in (f"access_token={TOKEN}", f"private_token={TOKEN}&ref=main", f"X-Amz-Signature={TOKEN}"):
        assert main(["install", f"git+https://127.0.0.1:{port}/org/repo.git?{query}", "--name", "Query", "--yes"]) == 2
        err = capsys.readouterr().err
        assert TOKEN not in err and "=***" in err and "USER:TOKEN@" in err
    # a password whose "/" was not encoded puts part of it where the host goes: none of it is shown
    assert main(["install", f"git+https://user:ab/{TOKEN}@127.0.0.1:{port}/r.git", "--name", "Slash", "--yes"]) == 2
    err = capsys.readouterr().err
    assert TOKEN not in err and "ab" not in err.split("error:")[1].split("percent-encode")[0]


def test_install_copies_what_include_names_and_lists_the_rest(repo, capsys):
    (repo.work / ".python-version").write_text("3.11\n")
    (repo.work / "token.txt").write_text(TOKEN)
    assert main(["install", str(repo.work), "--name", "Inc", "--yes", "--no-build", "--include", ".python-version"]) == 0
    out = capsys.readouterr().out
    entry = load_catalog()["Inc"]
    assert (Path(entry.source) / ".python-version").read_text() == "3.11\n"
    assert not (Path(entry.source) / "token.txt").exists() and "token.txt (may hold a secret)" in entry.isolated.excluded
    assert not any(e.startswith(".python-version") for e in entry.isolated.excluded)
    assert "--include PATH" in out and TOKEN not in out
