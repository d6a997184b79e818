"""Logging of every entry point (the window, `serve`, `chat`): records to stderr and to a rotating log file under
platformdirs' `user_log_dir` (`$EVOKE_HOME/log` when that is set), and the installed version the entry points print.

Invariants: `configure_logging` is idempotent (a second call replaces the handlers it added, never doubles them);
a log folder that cannot be created or written costs the file only (a warning on stderr), never the start; the file
rotates at `MAX_BYTES`, keeping `BACKUPS` older files; the file gets INFO and up, stderr what the caller asks; the
log folder is 0700 and every log file (rotated ones too) 0600 whatever the umask (`store.private`).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from importlib import metadata
from pathlib import Path

import platformdirs

from .settings import APP_NAME
from .store.private import FILE_MODE, private_file, private_mkdir

LOG_FILE_NAME = f"{APP_NAME}.log"
MAX_BYTES = 2 << 20
BACKUPS = 3
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_HANDLER_MARK = "_evoke_handler"
QUIET_LOGGERS = ("apscheduler",)         # a line per sweep at INFO: their warnings only, unless DEBUG is asked


def app_version() -> str:
    """The installed distribution's version, or the source tree's when it is run from a checkout."""
    try:
        return metadata.version(APP_NAME)
    except metadata.PackageNotFoundError:
        return "0.1.0 (source tree)"


def version_line(program: str) -> str:
    return f"{program} {app_version()}"


def log_dir(home: str | None = None) -> Path:
    """Where the log file lives: `<home>/log` for a home given or set in $EVOKE_HOME, else the platform's log dir."""
    home = home or os.environ.get("EVOKE_HOME")
    return Path(home) / "log" if home else Path(platformdirs.user_log_dir(APP_NAME))


def log_file(home: str | None = None) -> Path:
    return log_dir(home) / LOG_FILE_NAME


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating log file created 0600 (the umask can only narrow it) and narrowed to 0600 when it exists."""

    def _open(self):
        private_file(Path(self.baseFilename))
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors,   # noqa: SIM115
                    opener=lambda name, flags: os.open(name, flags, FILE_MODE))


def configure_logging(stderr_level: int = logging.WARNING, *, home: str | None = None,
                      file_level: int = logging.INFO) -> Path | None:
    """Send records to stderr (at `stderr_level`) and to the rotating log file (at `file_level`); the file's path,
    or None when it could not be opened (said on stderr)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(FORMAT)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(stderr_level)
    console.setFormatter(formatter)
    handlers: list[logging.Handler] = [console]
    path: Path | None = log_file(home)
    try:
        private_mkdir(path.parent)
        file_handler = PrivateRotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS,
                                                            encoding="utf-8")
        file_handler.setLevel(file_level)
        file_handler.setFormatter(formatter)
        handlers.append(file_handler)
    except OSError as exc:
        print(f"warning: cannot write the log file {path}: {exc}", file=sys.stderr)
        path = None
    for handler in handlers:
        setattr(handler, _HANDLER_MARK, True)
        root.addHandler(handler)
    root.setLevel(min(h.level for h in handlers))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING)
    return path
