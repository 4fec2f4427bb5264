"""Isolated imports without a venv build: snapshots, requirements, the catalog and registration.

The venv builds themselves (uv, minutes) are in ``test_venv_builds.py``, marked ``venv``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from openenv_gym.cli import main
from openenv_gym.errors import ConfigurationError, DetectionError
from openenv_gym.importers.catalog import load_catalog
from openenv_gym.importing import import_source
from openenv_gym.isolation import venvs
from openenv_gym.isolation.snapshot import snapshot
from openenv_gym.registration import register_catalog

ENVS = Path(__file__).resolve().parents[1] / "envs"
TOKEN = "sk-live-0123456789abcdef"  # a fake secret: it must never be copied


def call(name: str, args: dict | None = None) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args or {})}}]}


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENENV_GYM_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def probe_folder(tmp_path: Path) -> Path:
    """An ORS source folder with data, secrets, caches and a symlink out of it."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ENVS / "ors_probe.py", src / "env.py")
    shutil.copy(ENVS / "probe_common.py", src)
    (src / "data").mkdir()
    (src / "data" / "train.jsonl").write_text('{"q": 1}\n')
    (src / ".env").write_text(f"OPENAI_API_KEY={TOKEN}\n")
    (src / ".env.local").write_text(f"TOKEN={TOKEN}\n")
    (src / "keys").mkdir()
    (src / "keys" / "id_rsa").write_text(f"-----BEGIN KEY----- {TOKEN}\n")
    (src / "credentials.json").write_text(json.dumps({"token": TOKEN}))
    (src / "secrets.yaml").write_text(f"token: {TOKEN}\n")
    (src / ".git").mkdir()
    (src / ".git" / "config").write_text(f"[remote] url = https://x:{TOKEN}@example.invalid\n")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "env.cpython-311.pyc").write_bytes(b"\0")
    outside = tmp_path / "outside.txt"
    outside.write_text(TOKEN)
    (src / "linked.txt").symlink_to(outside)
    return src


def all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_a_folder_snapshot_keeps_data_and_leaves_secrets_and_caches_out(tmp_path, data_dir):
    src = probe_folder(tmp_path)
    snap = snapshot(src, "Probe")
    assert snap.path == snap.root and snap.root.is_relative_to(data_dir)
    copied = sorted(str(p.relative_to(snap.root)) for p in snap.root.rglob("*") if p.is_file())
    assert copied == ["data/train.jsonl", "env.py", "probe_common.py"]
    assert TOKEN.encode() not in all_bytes(data_dir)
    left_out = " ".join(snap.excluded)
    for name in (".env ", ".env.local", "keys/id_rsa", "credentials.json", "secrets.yaml", ".git/", "__pycache__/",
                 "linked.txt (a symlink out of the source)"):
        assert name in left_out
    # the same content is one snapshot; an edit of the original is a new one, the old one unchanged
    assert snapshot(src, "Probe").root == snap.root
    (src / "data" / "train.jsonl").write_text('{"q": 2}\n')
    again = snapshot(src, "Probe")
    assert again.root != snap.root and (snap.root / "data" / "train.jsonl").read_text() == '{"q": 1}\n'


def test_a_file_snapshot_takes_the_modules_it_imports_and_no_other_sibling(tmp_path):
    src = probe_folder(tmp_path)
    (src / "unrelated.py").write_text("x = 1\n")
    (src / "requirements.txt").write_text("tabulate>=0.9\n")
    snap = snapshot(src / "env.py", "Probe")
    assert snap.path == snap.root / "env.py"
    assert sorted(p.name for p in snap.root.iterdir()) == ["env.py", "probe_common.py", "requirements.txt"]


def test_requirements_are_the_sources_own_then_its_sdk_then_this_package(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1"\ndependencies = ["tabulate>=0.9"]\n')
    (src / "requirements.txt").write_text("# pinned\nrich==13.7.1  # for the tool output\n\n")
    reqs = venvs.requirements_for("ors", src, sdk="ors")
    assert reqs[:2] == ["tabulate>=0.9", "rich==13.7.1"]
    assert [r for r in reqs if r.startswith(("ors-sdk", "openreward"))] == [r for r in reqs if r.startswith("ors-sdk")]
    assert any(r.startswith("ors-sdk") for r in reqs)
    assert reqs[-1] == venvs.this_package()
    # the dev install is editable: hosts run this checkout's code
    assert venvs.this_package().startswith("-e ") and Path(venvs.this_package()[3:], "openenv_gym").is_dir()
    # a source that pins its SDK keeps its pin; a legacy Verifiers source gets the last release with its API
    (src / "requirements.txt").write_text("ors-sdk==0.1.0\n")
    assert [r for r in venvs.requirements_for("ors", src, sdk="ors") if "ors-sdk" in r] == ["ors-sdk==0.1.0"]
    assert "verifiers>=0.3.1,<0.4" in venvs.requirements_for("verifiers", None, sdk="v0")
    assert "verifiers>=0.3.1" in venvs.requirements_for("verifiers", None, sdk="v1")
    # an option line could reach beyond the registries: refused by name
    (src / "requirements.txt").write_text("--index-url https://example.invalid/simple\nrich\n")
    with pytest.raises(ConfigurationError, match="--index-url"):
        venvs.requirements_for("ors", src)


def test_an_isolated_import_records_its_snapshot_and_plays_it_not_the_original(tmp_path, data_dir):
    src = probe_folder(tmp_path)
    entry = import_source(src, "IsoProbe", env_class="Probe", isolated=True, build=False)
    assert Path(entry.source).is_relative_to(data_dir) and entry.origin == str(src)
    assert entry.isolated.venv is None and any(r.startswith("ors-sdk") for r in entry.isolated.requirements)
    assert ".env (may hold a secret)" in entry.isolated.excluded
    stored = load_catalog()["IsoProbe"]
    assert stored.isolated == entry.isolated
    assert TOKEN not in Path(__import__("os").environ["OPENENV_GYM_CATALOG"]).read_text()
    register_catalog()
    spec = gym.spec("openenv/IsoProbe-v0")
    assert spec.kwargs["isolate"] is True and spec.kwargs["source"] == entry.source
    # the original changes (a tool removed): the imported id still plays the snapshot
    (src / "env.py").write_text((src / "env.py").read_text().replace("def hint(", "def renamed_hint("))
    env = gym.make("openenv/IsoProbe-v0", python=sys.executable)  # a named interpreter wins over isolate
    try:
        _, info = env.reset(seed=0)
        assert "hint" in {t["function"]["name"] for t in info["tools"]}
        assert type(env.unwrapped.runner).__name__ == "HostRunner"
    finally:
        env.close()
    in_process = gym.make("openenv/IsoProbe-v0", isolate=False)
    try:
        assert type(in_process.unwrapped.runner).__name__ == "SessionRunner"
        in_process.reset(seed=0)
        assert in_process.step(call("hint"))[0][0]["role"] == "tool"
    finally:
        in_process.close()


def test_the_cli_imports_isolated_and_says_what_it_left_out(tmp_path, capsys):
    src = probe_folder(tmp_path)
    assert main(["import", str(src / "env.py"), "--name", "CliIso", "--env-class", "Probe", "--isolated",
                 "--no-build"]) == 0
    out = capsys.readouterr().out
    assert "snapshot:" in out and "requirements:" in out and "built at the first gym.make" in out
    assert main(["import", str(src), "--name", "NotIso", "--env-class", "Probe", "--python", "3.12"]) == 2
    assert "--isolated" in capsys.readouterr().err


def test_isolate_needs_a_kind_it_knows():
    with pytest.raises(ConfigurationError, match="must be True or a Python version"):
        gym.make("openenv/Arithmetic-v0", isolate=3)


def test_python_for_refuses_an_unknown_kind():
    with pytest.raises(ConfigurationError, match="no isolated venv for kind"):
        venvs.requirements_for("nope", None)


def test_detection_error_before_anything_is_copied(tmp_path, data_dir):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DetectionError):
        import_source(tmp_path / "empty", "Nothing", isolated=True, build=False)
    assert not data_dir.exists()


# -- what a snapshot must never take: symlinks into left-out places, dotfiles, credential-shaped names --
def test_a_symlink_into_a_left_out_folder_or_file_is_left_out_and_listed(tmp_path, data_dir):
    src = probe_folder(tmp_path)
    (src / "gitcfg").symlink_to(".git/config")            # the token of .git/config, under another name
    (src / "creds").symlink_to("credentials.json")         # a secret file under a harmless name
    (src / "nested").mkdir()
    (src / "nested" / "up").symlink_to("../.git/config")   # the same, relative, from a subfolder
    (src / "chain").symlink_to("gitcfg")                   # a chain of symlinks ending in .git/
    (src / "tasks.jsonl").symlink_to("data/train.jsonl")  # a symlink to a file that is copied: copied
    (src / "loop").symlink_to("loop")
    (src / "data_link").symlink_to("data")                 # folders are not followed, even inside
    snap = snapshot(src, "Probe")
    copied = sorted(str(p.relative_to(snap.root)) for p in snap.root.rglob("*"))
    assert copied == ["data", "data/train.jsonl", "env.py", "probe_common.py", "tasks.jsonl"]
    assert not (snap.root / "tasks.jsonl").is_symlink() and (snap.root / "tasks.jsonl").read_text() == '{"q": 1}\n'
    assert TOKEN.encode() not in all_bytes(data_dir)
    left_out = "\n".join(snap.excluded)
    for line in ("gitcfg (a symlink to .git/config, which is left out: inside .git/", "creds (a symlink to "
                 "credentials.json", "nested/up (a symlink to .git/config", "chain (a symlink to .git/config",
                 "loop (a broken or looping symlink)", "data_link (a symlink to a folder: not followed)"):
        assert line in left_out, left_out


def test_dotfiles_and_credential_shaped_names_are_left_out_and_code_and_data_are_not(tmp_path, data_dir):
    src = probe_folder(tmp_path)
    secrets = [".pgpass", ".dockercfg", "kubeconfig", "service-account.json", "token.txt", ".htpasswd",
               "github_token", "client_secret_123.json", "prod.tfvars", "api-key.txt", "serviceAccount.json",
               ".python-version", ".config/app.toml", "secrets/db.yaml", "deploy/kubeconfig.yaml"]
    kept = ["tokenizer.json", "special_tokens_map.json", "token_utils.py", "data/passages.jsonl", "keys.py",
            "password_game/__init__.py", "password_game/rules.py", "build/x.txt"]  # code and data
    for rel in secrets + kept:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(f"x = {TOKEN!r}\n" if rel in secrets else "x = 1\n")
    snap = snapshot(src, "Probe")
    copied = {str(p.relative_to(snap.root)) for p in snap.root.rglob("*") if p.is_file()}
    assert set(kept) <= copied and not copied & set(secrets)
    assert TOKEN.encode() not in all_bytes(data_dir)
    listed = {line.split(" (")[0] for line in snap.excluded}
    assert {s for s in secrets if "/" not in s} | {".config/", "secrets/", "deploy/kubeconfig.yaml"} <= listed


def test_include_copies_a_named_left_out_file_and_never_a_symlink_out(tmp_path, data_dir, capsys):
    src = probe_folder(tmp_path)
    (src / ".python-version").write_text("3.11\n")
    (src / ".config").mkdir()
    (src / ".config" / "app.toml").write_text("debug = true\n")
    (src / ".config" / "token.txt").write_text(TOKEN)
    snap = snapshot(src, "Probe", include=[".python-version", ".config", "linked.txt"])
    assert (snap.root / ".python-version").read_text() == "3.11\n"
    assert (snap.root / ".config" / "app.toml").is_file()  # the folder is named: its own files judged by name
    assert not (snap.root / ".config" / "token.txt").exists() and not (snap.root / "linked.txt").exists()
    assert "linked.txt (a symlink out of the source)" in snap.excluded
    assert ".config/token.txt (may hold a secret)" in snap.excluded
    only = snapshot(src, "Probe", include=[".git/config"]).root  # a file inside a left-out folder, alone
    assert sorted(p.name for p in (only / ".git").iterdir()) == ["config"]
    with pytest.raises(ConfigurationError, match="inside it"):
        snapshot(src, "Probe", include=["../outside.txt"])
    # the command line: the list says how to include, and --include does it
    assert main(["import", str(src), "--name", "Inc", "--env-class", "Probe", "--isolated", "--no-build",
                 "--include", ".python-version"]) == 0
    out = capsys.readouterr().out
    assert "--include PATH" in out and ".python-version" not in out.split("left out of the snapshot:")[1]
    assert (Path(load_catalog()["Inc"].source) / ".python-version").is_file()


def test_a_single_file_import_takes_no_sibling_or_requirement_that_links_out(tmp_path, data_dir, capsys):
    from isolation_envs import one_tool_env

    home = tmp_path / "home"  # a single file's folder may be anything: here, beside the user's secrets
    src = tmp_path / "src"
    home.mkdir(), src.mkdir()
    (home / "keys.py").write_text(f"API_KEY = {TOKEN!r}\n")
    (home / "reqs").write_text(f"private-pkg @ https://user:{TOKEN}@example.invalid/x.whl\n")
    (src / "env.py").write_text(one_tool_env("Tiny", "go", "'ok'", imports="import helper\nimport secrets\n"))
    (src / "helper.py").symlink_to(home / "keys.py")
    (src / "secrets.py").write_text(f"TOKEN = {TOKEN!r}\n")
    (src / "requirements.txt").symlink_to(home / "reqs")
    assert main(["import", str(src / "env.py"), "--name", "Single", "--isolated", "--no-build"]) == 0
    out = capsys.readouterr().out
    assert TOKEN not in out and "private-pkg" not in out
    entry = load_catalog()["Single"]
    assert sorted(p.name for p in Path(entry.source).parent.iterdir()) == ["env.py"]
    assert not any("private-pkg" in r for r in entry.isolated.requirements)
    assert set(entry.isolated.excluded) >= {"helper.py (a symlink out of the source)",
                                            "requirements.txt (a symlink out of the source)",
                                            "secrets.py (may hold a secret)"}
    assert TOKEN not in Path(os.environ["OPENENV_GYM_CATALOG"]).read_text() and TOKEN.encode() not in all_bytes(data_dir)


def test_a_symlinked_package_folder_is_not_followed(tmp_path, data_dir):
    from isolation_envs import one_tool_env

    (tmp_path / "elsewhere" / "pkg").mkdir(parents=True)
    (tmp_path / "elsewhere" / "pkg" / "__init__.py").write_text(f"TOKEN = {TOKEN!r}\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "env.py").write_text(one_tool_env("Tiny", "go", "'ok'", imports="import pkg\n"))
    (src / "pkg").symlink_to(tmp_path / "elsewhere" / "pkg")
    snap = snapshot(src / "env.py", "Single")
    assert sorted(p.name for p in snap.root.iterdir()) == ["env.py"]
    assert "pkg/ (a symlink to a folder: not followed)" in snap.excluded
