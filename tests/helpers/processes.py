"""Child processes of the process-level tests (`serve`, the window): the environment they run in, and a child whose
stdout lines are read on a thread so a test can wait for one and then signal it."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def environment(home: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "EVOKE_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}


class Child:
    """A child process whose stdout lines are read on a thread (a test waits for one without blocking on it)."""

    def __init__(self, args: list[str], home: Path) -> None:
        self.proc = subprocess.Popen(args, cwd=ROOT, env=environment(home), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if found := re.search(pattern, line):
                    return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"no line matching {pattern!r}; stdout {self.lines}, stderr {self.proc.stderr.read()}")

    def stop_with(self, signum: int, timeout: float = 60.0) -> tuple[int, str]:
        self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(5)
        return code, self.proc.stderr.read()
