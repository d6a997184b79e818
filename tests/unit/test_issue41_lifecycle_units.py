"""Issue 41's process-level logic on plain objects (no model, no window): the shutdown signals become a call, the
log file rotates where the platform keeps logs, a stateless request that came to nothing is told apart, and the
PyInstaller spec carries the native files and the icon (read with stub PyInstaller objects: nothing is built)."""

from __future__ import annotations

import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.spec_stub import run_spec

from evoke_engine import logs
from evoke_engine.package_files import NATIVE_FILES, bundle_native_files
from evoke_engine.server.service import ChatService
from evoke_engine.shutdown import SHUTDOWN_SIGNALS, shutdown_signals

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


# -- shutdown signals ------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_each_shutdown_signal_calls_back_instead_of_ending_the_process(signum):
    before = signal.getsignal(signum)
    called: list[int] = []
    with shutdown_signals(called.append) as received:
        os.kill(os.getpid(), signum)              # the handler runs at the next bytecode of this thread
    assert called == [signum] and received == [signum]
    assert signal.getsignal(signum) is before                  # the previous handler is back


def test_off_the_main_thread_nothing_is_installed():
    before = {sig: signal.getsignal(sig) for sig in SHUTDOWN_SIGNALS}
    seen: list[dict] = []

    def run() -> None:
        with shutdown_signals(lambda _s: None):
            seen.append({sig: signal.getsignal(sig) for sig in SHUTDOWN_SIGNALS})
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert seen == [before]


# -- the log file ------------------------------------------------------------------------------------
@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def test_the_log_file_rotates_under_the_home_and_a_second_call_adds_no_handlers(tmp_path, restore_root_logger):
    path = logs.configure_logging(logging.WARNING, home=str(tmp_path))
    again = logs.configure_logging(logging.WARNING, home=str(tmp_path))
    assert path == again == tmp_path / "log" / "evoke-desk.log"
    ours = [h for h in restore_root_logger.handlers if getattr(h, "_evoke_handler", False)]
    rotating = [h for h in ours if isinstance(h, logging.handlers.RotatingFileHandler)]
    assert len(ours) == 2 and len(rotating) == 1
    assert rotating[0].maxBytes == logs.MAX_BYTES and rotating[0].backupCount == logs.BACKUPS
    logging.getLogger("evoke_engine.test").error("the model file /nope.gguf does not exist")
    rotating[0].flush()
    assert "/nope.gguf" in path.read_text()


def test_the_platform_log_folder_is_used_without_a_home(monkeypatch):
    import platformdirs

    monkeypatch.delenv("EVOKE_HOME", raising=False)
    assert logs.log_dir() == Path(platformdirs.user_log_dir("evoke-desk"))


def test_a_log_folder_that_cannot_be_made_costs_only_the_file(tmp_path, restore_root_logger, capsys):
    (tmp_path / "log").write_text("a file where the folder should be")
    assert logs.configure_logging(logging.WARNING, home=str(tmp_path)) is None
    assert "cannot write the log file" in capsys.readouterr().err


def test_the_version_line_names_the_program_and_the_version():
    assert logs.version_line("evoke-desk").startswith("evoke-desk 0.")


# -- stateless requests ------------------------------------------------------------------------------
def prepared(*, session=None, tokens_seen=False, result=None, error=None, cancelled=False,
             acknowledged=False) -> SimpleNamespace:
    future: Future = Future()
    if cancelled:
        future.cancel()
    elif error is not None:
        future.set_exception(error)
    elif result is not None:
        future.set_result(result)
    return SimpleNamespace(session=session, tokens_seen=tokens_seen, future=future, acknowledged=acknowledged)


def test_a_stateless_request_came_to_nothing_only_without_a_token():
    empty = SimpleNamespace(stopped="cancelled", n_tokens=0)
    assert ChatService.came_to_nothing(prepared(result=empty))
    assert ChatService.came_to_nothing(prepared(error=RuntimeError("engine")))
    assert not ChatService.came_to_nothing(prepared(error=RuntimeError("engine"), acknowledged=True))  # 200 sent
    assert ChatService.came_to_nothing(prepared(cancelled=True))
    assert not ChatService.came_to_nothing(prepared(result=empty, tokens_seen=True))        # a token came
    assert not ChatService.came_to_nothing(prepared(result=empty, session="s1"))             # a session's turn
    assert not ChatService.came_to_nothing(prepared(result=SimpleNamespace(stopped="eos", n_tokens=0)))


# -- packaging -----------------------------------------------------------------------------------------
def read_spec(root: Path) -> dict:
    """Run packaging/evoke-desk.spec against stub PyInstaller objects; what it passed to each."""
    return run_spec(root)


def _native_files(root: Path) -> list[tuple[Path, str]]:
    files = bundle_native_files(root)
    for path, _ in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF")
    return files


def test_the_bundle_carries_the_native_libraries_rpc_server_and_the_icon(tmp_path):
    files = _native_files(tmp_path)
    seen = read_spec(tmp_path)
    binaries = seen["Analysis"][1]["binaries"]
    assert {path.name for path, _ in files} == set(NATIVE_FILES)   # the direct KV path and the 8/4-bit kernels too
    for path, folder in files:                     # each CPU variant (issue 62), where package_files looks
        assert (str(path), folder) in binaries
    icon = Path(seen["EXE"][1]["icon"])
    assert icon == tmp_path / "packaging" / "evoke-desk.png"
    assert (ROOT / "packaging" / "evoke-desk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_bundle_is_not_built_without_one_of_its_native_files(tmp_path):
    for gone, _ in (_native_files(tmp_path)[0], _native_files(tmp_path)[-1]):   # a variant's library, rpc-server
        gone.unlink()
        with pytest.raises(SystemExit, match=str(gone)):
            read_spec(tmp_path)


def test_the_system_library_check_warns_and_never_fails():
    done = subprocess.run(["bash", str(ROOT / "packaging" / "check-system-libs.sh"), sys.executable],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    if "lacks" in done.stderr:                                   # a machine without some of them (this one)
        assert "sudo apt-get install" in done.stderr
    else:
        assert "all present" in done.stdout or "skipped" in done.stdout


def test_a_desktop_logout_writes_the_conversations_open_in_a_slot_or_ram():
    from app.system_quit import persist_open_conversations

    written: list[str] = []
    engine = SimpleNamespace(
        conversations=lambda: [SimpleNamespace(id="a", memory="slot"), SimpleNamespace(id="b", memory="ram"),
                               SimpleNamespace(id="c", memory="disk"), SimpleNamespace(id="d", memory="none")],
        persist=lambda cid: written.append(cid) or True)
    assert persist_open_conversations(engine) == 2 and written == ["a", "b"]
    assert persist_open_conversations(None) == 0                   # no engine yet (the model still loading)
