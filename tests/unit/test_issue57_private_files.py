"""Issue 57, item 7: under umask 000 the log file (and each rotated one) is 0600, its folder 0700, and a data folder
the engine creates to lock it is 0700; files that existed wider are narrowed."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from evoke_engine.logs import configure_logging
from evoke_engine.store.owner import DataFolderLock

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX modes")


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_log_file_and_its_folder_are_private_under_umask_000(tmp_path, open_umask, restore_logging):
    home = tmp_path / "home"
    path = configure_logging(home=str(home))
    logging.getLogger("issue57").warning("a line")
    assert path is not None and path.exists()
    assert mode_of(path) == 0o600
    assert mode_of(path.parent) == 0o700 and mode_of(home) == 0o700


def test_a_rotated_log_file_is_private_too(tmp_path, open_umask, restore_logging):
    path = configure_logging(home=str(tmp_path / "home"))
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "baseFilename", None) == str(path))
    handler.doRollover()
    logging.getLogger("issue57").warning("after the rollover")
    assert mode_of(path) == 0o600 and mode_of(str(path) + ".1") == 0o600


def test_an_existing_wide_log_file_is_narrowed(tmp_path, open_umask, restore_logging):
    folder = tmp_path / "home" / "log"
    folder.mkdir(parents=True)
    wide = folder / "evoke-desk.log"
    wide.write_text("old\n")
    os.chmod(wide, 0o666)
    path = configure_logging(home=str(tmp_path / "home"))
    assert path == wide and mode_of(wide) == 0o600


def test_a_data_folder_created_for_its_lock_is_private_under_umask_000(tmp_path, open_umask):
    folder = tmp_path / "new" / "data"
    lock = DataFolderLock(folder).acquire()
    try:
        assert mode_of(folder) == 0o700 and mode_of(folder.parent) == 0o700
        assert mode_of(folder / "evoke-desk.lock") == 0o600
    finally:
        lock.release()
