"""Issue 25: one process owns a data folder. A second Engine (in this process or another, `serve` beside the
window) is refused with a message naming the folder and starts nothing; closing (or a failed start) gives the
folder back. Engines run the real embedded model; the lock itself is tested on plain objects."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.errors import DataDirInUseError, ModelLoadError
from evoke_engine.store.owner import DataFolderLock

ROOT = Path(__file__).resolve().parents[2]


def settings_for(home: Path, **changes) -> Settings:
    return Settings(home=str(home), budget_tokens=384, n_ctx=2048, slots=1, embedder="off", **changes)


def test_the_lock_excludes_a_second_holder_in_this_process_and_a_release_from_another_thread_frees_it(tmp_path):
    first = DataFolderLock(tmp_path).acquire()
    with pytest.raises(DataDirInUseError, match=str(tmp_path)):
        DataFolderLock(tmp_path).acquire()
    closer = threading.Thread(target=first.release)                 # the app closes the engine off its GUI thread
    closer.start()
    closer.join()
    assert not first.held
    second = DataFolderLock(tmp_path).acquire()
    first.release()                                                 # idempotent: takes nothing from the new owner
    assert second.held
    with pytest.raises(DataDirInUseError):
        DataFolderLock(tmp_path).acquire()
    second.release()


def test_a_second_engine_on_the_same_home_is_refused_and_leaves_nothing_running(tmp_path):
    settings = settings_for(tmp_path)
    with Engine(settings, scheduler=False, prewarm=False) as first:
        threads = set(threading.enumerate())
        with pytest.raises(DataDirInUseError, match=f"using the data folder {settings.data_dir}"):
            Engine(settings, scheduler=False, prewarm=False)
        assert set(threading.enumerate()) == threads                  # no engine thread, no scheduler left behind
        assert first.tokenize("still mine")                           # the owner is untouched
    with Engine(settings, scheduler=False, prewarm=False) as again:     # closed: the folder is free
        assert again.model_loaded


def test_a_failed_start_gives_the_folder_back(tmp_path):
    with pytest.raises(ModelLoadError):
        Engine(settings_for(tmp_path, model_path=str(tmp_path / "missing.gguf")), scheduler=False)
    DataFolderLock(settings_for(tmp_path).data_dir).acquire().release()


def test_serve_on_a_folder_the_window_holds_exits_2_and_points_at_the_windows_endpoint(tmp_path):
    settings = settings_for(tmp_path)
    env = {**os.environ, "EVOKE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    with Engine(settings, scheduler=False, prewarm=False):           # as the window does
        # --lifetime bounds a serve that wrongly started; timeout only guards against a hang
        done = subprocess.run([sys.executable, "-m", "evoke_engine", "serve", "--port", "0", "--lifetime", "20"],
                              capture_output=True, text=True, env=env, timeout=240, cwd=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert f"using the data folder {settings.data_dir}" in done.stderr
    assert "Settings → Endpoint" in done.stderr


@pytest.mark.gui
def test_the_window_on_a_held_folder_says_so_and_starts_no_engine(qapp, qtbot, tmp_path):
    from app.__main__ import build
    from integration.test_app_gui import REPLY_MS, test_settings

    settings = test_settings(tmp_path)
    with Engine(settings, scheduler=False, prewarm=False):
        bridge, controller, window = build(settings, (1000, 700))
        window.show()
        try:
            with qtbot.wait_signal(controller.modelStateChanged, timeout=REPLY_MS,
                                   check_params_cb=lambda state, _detail: state == "failed"):
                controller.start()
            assert bridge.engine is None
            assert str(settings.data_dir) in window.banner.text()
            assert "read-only" in window.banner.text() and "Settings → Model" not in window.banner.text()
        finally:
            window.close()
            bridge.close()
