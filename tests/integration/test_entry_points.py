"""Issue 41, item 10, as a user starts the programs: `--version` on every entry point (before: exit 2),
`evoke-desk chat|device` run the engine's command line, a bad model path lands on stderr and in the log file that
Help → About names, and a second window on the same data folder brings the first to the front and exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.processes import Child, environment

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args: list[str], home: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=environment(home), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", [["-m", "app"], ["-m", "evoke_engine"], ["evoke-desk"], ["evoke-engine"]])
def test_every_entry_point_says_its_version(tmp_path, command):
    if command[0] != "-m" and not (BIN / command[0]).exists():
        pytest.skip(f"{command[0]} is not installed in this environment")
    args = [sys.executable, *command] if command[0] == "-m" else [str(BIN / command[0])]
    done = run([*args, "--version"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split()[-1][0].isdigit() and "evoke-" in done.stdout


def test_the_window_entry_forwards_device_and_chat_to_the_engine_and_logs_a_bad_model(tmp_path):
    device = run([sys.executable, "-m", "app", "device"], tmp_path)
    assert device.returncode == 0, device.stderr
    assert "kind" in json.loads(device.stdout)
    chat = run([sys.executable, "-m", "app", "chat", "--model", str(tmp_path / "missing.gguf")], tmp_path)
    assert chat.returncode == 2
    assert "missing.gguf" in chat.stderr
    assert "missing.gguf" in (tmp_path / "log" / "evoke-desk.log").read_text()


def test_about_names_the_log_file(tmp_path, monkeypatch):
    from app.help_dialogs import about_facts
    from evoke_engine import Settings

    monkeypatch.setenv("EVOKE_HOME", str(tmp_path))
    facts = dict(about_facts(Settings(), None))
    assert facts["Log file"] == str(tmp_path / "log" / "evoke-desk.log")


def test_a_second_window_on_the_same_data_folder_brings_the_first_to_the_front(tmp_path):
    first = Child([sys.executable, str(ROOT / "tests" / "helpers" / "window_child.py"), "Say hi.", "4"], tmp_path)
    try:
        first.wait_for(r"^REPLIED ")                     # the first window is up, its engine holds the folder
        second = run([sys.executable, "-m", "app"], tmp_path, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "already open on this data folder" in second.stdout
        code, stderr = first.stop_with(signal.SIGTERM)
        assert code == 0, stderr
        assert "another start asked for this window" in stderr
    finally:
        if first.proc.poll() is None:
            os.kill(first.proc.pid, signal.SIGKILL)


def _engine_subcommands() -> list[str]:
    from evoke_engine.__main__ import build_parser, subcommands

    return subcommands(build_parser())


def test_the_window_entry_forwards_every_engine_subcommand():
    from app.__main__ import ENGINE_COMMANDS

    assert sorted(ENGINE_COMMANDS) == sorted(_engine_subcommands())


@pytest.mark.parametrize("entry", [["-m", "evoke_engine"], ["-m", "app"]])
@pytest.mark.parametrize("command", _engine_subcommands())
def test_every_subcommand_of_both_entry_points_says_its_help(tmp_path, entry, command):
    """Issue 58 item 3: each subcommand parses and imports what its help needs (`aider-metadata` crashed)."""
    done = run([sys.executable, *entry, command, "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:") and command in done.stdout.splitlines()[0]


def test_the_window_entry_says_its_help(tmp_path):
    done = run([sys.executable, "-m", "app", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "evoke-desk" in done.stdout


@pytest.mark.parametrize("entry", [["-m", "evoke_engine"], ["-m", "app"]])
def test_aider_metadata_and_device_run_for_real(tmp_path, entry):
    """Issue 58 item 3: `aider-metadata` printed a ModuleNotFoundError (it imported a renamed module)."""
    from evoke_engine import Settings
    from evoke_engine.server.api_errors import context_tokens

    done = run([sys.executable, *entry, "aider-metadata", "--name", "openai/mine"], tmp_path)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)["openai/mine"]
    assert info["max_input_tokens"] == context_tokens(Settings()) and info["mode"] == "chat"
    device = run([sys.executable, *entry, "device"], tmp_path)
    assert device.returncode == 0, device.stderr
    assert "kind" in json.loads(device.stdout)
