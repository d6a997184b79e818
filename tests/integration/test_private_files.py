"""Secrets stay private: data files 0600 in 0700 folders whatever the umask, the endpoint's key from a file or
the environment, and a failed KV file write is logged (with its conversation id) where `serve` shows it."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.__main__ import API_KEY_ENV, resolve_api_key
from evoke_engine.store import HistoryDB, KVFileStore

ROOT = Path(__file__).resolve().parents[2]
MODEL = "0123456789abcdef"

pytestmark = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")


@pytest.fixture
def permissive_umask():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def modes_under(home: Path) -> dict[str, int]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(home):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            found[str(path.relative_to(home))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def not_private(home: Path) -> dict[str, str]:
    return {name: oct(mode) for name, mode in modes_under(home).items()
            if mode != (0o700 if (home / name).is_dir() else 0o600)}


@pytest.mark.slow
def test_a_fresh_home_after_a_turn_holds_only_private_files_and_folders(tmp_path, permissive_umask):
    home = tmp_path / "home"
    settings = Settings(home=str(home), budget_tokens=384, n_ctx=4096, slots=1, ram_budget_bytes=0, embedder="off")
    settings.save()
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        first = engine.new_conversation(system_prompt="You are brief.", tools=[])
        first.send("Remember the word lantern.", max_tokens=4, temperature=0)
        engine.new_conversation(system_prompt="You are brief.", tools=[])   # one slot: the first spills
        assert list(engine.diagnostics().pool.spill_dir.glob("*.kv"))
        assert engine.persist(first.id)
        files = modes_under(home)
        assert any(name.endswith(".bin") for name in files) and any("history" in name for name in files)
        assert any(name.endswith(".kv") for name in files) and "config/settings.json" in files
        assert not_private(home) == {}
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert not_private(home) == {}


def test_files_and_folders_of_an_older_install_are_narrowed_at_start(tmp_path, permissive_umask):
    home = tmp_path / "home"
    for kind in ("data", "config", "cache/kv/" + MODEL):
        (home / kind).mkdir(parents=True, mode=0o755)
        os.chmod(home / kind, 0o755)
    (home / "config" / "settings.json").write_text("{}")
    HistoryDB(home / "data" / "history.sqlite3").close()
    for path in (home / "data" / "history.sqlite3", home / "config" / "settings.json"):
        os.chmod(path, 0o644)
    store = KVFileStore(home / "cache", MODEL)
    store.write("c1", "long", b"x" * 64)
    os.chmod(store.directory / "c1.long.bin", 0o644)
    assert not_private(home)

    settings = Settings.load(home=str(home))
    HistoryDB(settings.data_dir / "history.sqlite3").close()
    assert settings.config_dir and settings.cache_dir
    store.check(fix=True)
    assert not_private(home) == {}


# -- the endpoint's key -------------------------------------------------------------------------------
def key_args(**given) -> argparse.Namespace:
    return argparse.Namespace(api_key=given.get("api_key"), api_key_file=given.get("api_key_file"))


def test_the_key_comes_from_a_file_or_the_environment_and_the_command_line_is_warned_about(tmp_path, capsys):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key\n")
    os.chmod(key_file, 0o600)
    assert resolve_api_key(key_args(api_key_file=str(key_file)), "", environ={}) == "s3cret-key"
    assert capsys.readouterr().err == ""
    assert resolve_api_key(key_args(), "from-settings", environ={API_KEY_ENV: "from-env"}) == "from-env"
    assert resolve_api_key(key_args(), "from-settings", environ={}) == "from-settings"
    assert resolve_api_key(key_args(), "", environ={}) is None
    assert resolve_api_key(key_args(api_key="on-the-command-line"), "", environ={}) == "on-the-command-line"
    assert "process list" in capsys.readouterr().err
    os.chmod(key_file, 0o644)
    assert resolve_api_key(key_args(api_key_file=str(key_file)), "", environ={}) == "s3cret-key"
    assert "readable by other users" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("", "empty"), ("a b\n", "one line")])
def test_a_bad_key_file_is_a_clear_error(tmp_path, content, message):
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(ValueError, match=message):
        resolve_api_key(key_args(api_key_file=str(key_file)), "", environ={})
    with pytest.raises(ValueError, match="not both"):
        resolve_api_key(key_args(api_key_file=str(key_file), api_key="k"), "", environ={})


def test_serve_rejects_a_missing_key_file_before_loading_anything(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVOKE_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "evoke_engine", "serve", "--api-key-file", str(tmp_path / "nope")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "cannot read the API key file" in out.stderr and "loading" not in out.stdout


# -- a failed KV write is logged where `serve` shows it ------------------------------------------------
LOGGED_WRITE = f"""
import uvicorn
from pathlib import Path
from evoke_engine.__main__ import configure_logging
from evoke_engine.store import KVFileStore, StoreError
configure_logging()
uvicorn.Config(app=lambda *a: None, log_level="warning")      # what EndpointServer builds: its logging config
store = KVFileStore(Path(r"{{root}}"), "{MODEL}")
(store.directory / "conv-42.long.bin").mkdir(parents=True)     # the write cannot replace a folder
try:
    store.write("conv-42", "long", b"x" * 64)
except StoreError as exc:
    print("raised:", exc)
"""


def test_a_failed_kv_write_is_logged_with_its_conversation_by_serves_logging(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", LOGGED_WRITE.replace("{root}", str(tmp_path))],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert "raised:" in out.stdout, out.stderr
    assert "WARNING evoke_engine.store.kvfiles" in out.stderr and "conv-42" in out.stderr
