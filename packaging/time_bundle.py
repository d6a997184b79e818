"""Times the one-folder bundle as a user meets it and prints JSON (the figures in docs/install.md):
`python3 packaging/time_bundle.py [dist/evoke-desk] [--venv .venv] [--repeat 3]`. Standard library only.

- size: `du -sh` of the folder and of its largest parts;
- version_s: `evoke-desk --version`;
- window_s: start to the window drawn, offscreen: `--settings-screenshot` opens the window and its settings dialog
  (no model load) and writes the PNG 0.5 s later (its timer, subtracted here);
- first_reply_s: start of `evoke-desk chat` to the first character of the reply to a one-line message (model load,
  prefix, prefill, first token);
- each first in a fresh home (the bundle copies its embedder export into the user's cache then; a venv exports it
  with torch), then warm (the median of --repeat runs in that home); with --venv, the same from that venv's
  `python -m app` for comparison.
The load average is printed with the figures: above 2 on this 2-core machine the figures are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHOT_TIMER_S = 0.5            # app/demo.py settings_screenshot grabs the dialog this long after opening it
MESSAGE = "Name one planet.\n"


def env_for(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "QT_QPA_PLATFORM": "offscreen"}


def timed_version(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([*cmd, "--version"], env=env, capture_output=True, check=True, timeout=120)
    return time.perf_counter() - start


def timed_window(cmd: list[str], env: dict[str, str], home: Path) -> float:
    shot = home / f"shot-{time.monotonic_ns()}.png"
    start = time.perf_counter()
    proc = subprocess.Popen([*cmd, "--settings-screenshot", str(shot)], env=env, cwd=home,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not shot.exists() and proc.poll() is None:
        time.sleep(0.01)
    drawn = time.perf_counter() - start - SHOT_TIMER_S
    proc.wait(timeout=120)
    if not shot.exists():
        raise RuntimeError(f"{cmd} --settings-screenshot wrote nothing (exit {proc.returncode})")
    return drawn


def timed_first_reply(cmd: list[str], env: dict[str, str], home: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen([*cmd, "chat"], env=env, cwd=home, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    proc.stdin.write(MESSAGE.encode())
    proc.stdin.flush()
    seen, first = b"", None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 600
    while first is None and time.monotonic() < deadline:
        if not selector.select(timeout=1):
            continue
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
        prompt = seen.find(b"evoke> ")
        if prompt >= 0 and len(seen) > prompt + len(b"evoke> "):
            first = time.perf_counter() - start
    proc.stdin.write(b"/quit\n")
    proc.stdin.close()
    proc.stdout.read()
    proc.wait(timeout=120)
    if first is None:
        raise RuntimeError(f"{cmd} chat gave no reply: {seen[-500:]!r}")
    return first


def measure(cmd: list[str], repeat: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="evk-time-") as tmp:
        figures: dict[str, float] = {}
        for name, fn in (("window_s", timed_window), ("first_reply_s", timed_first_reply)):
            home = Path(tmp) / name
            home.mkdir()
            env = env_for(home)
            figures[f"{name[:-2]}_fresh_home_s"] = round(fn(cmd, env, home), 2)
            figures[name] = round(statistics.median(fn(cmd, env, home) for _ in range(repeat)), 2)
        home = Path(tmp) / "version"
        home.mkdir()
        figures["version_s"] = round(statistics.median(timed_version(cmd, env_for(home)) for _ in range(repeat)), 2)
        return figures


def cpu_model() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    return f"{name or platform.machine()}{' (AVX-512)' if 'avx512f' in info else ''}"


def sizes(folder: Path) -> dict[str, str]:
    def du(path: Path) -> str:
        return subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True).stdout.split()[0]

    internal = folder / "_internal"
    parts = sorted((p for p in internal.iterdir()), key=lambda p: -int(subprocess.run(
        ["du", "-sk", str(p)], capture_output=True, text=True).stdout.split()[0]))[:8]
    return {"total": du(folder), **{p.name: du(p) for p in parts}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", nargs="?", default="dist/evoke-desk")
    parser.add_argument("--venv", help="also time this venv's python -m app / -m evoke_engine")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = Path(args.bundle).resolve()
    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 30
    report = {"machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib} GiB",
              "date": time.strftime("%Y-%m-%d"), "load_before": os.getloadavg()[0], "size": sizes(folder),
              "bundle": measure([str(folder / "evoke-desk")], args.repeat)}
    if args.venv:                                   # `python -m app chat` is the engine's chat, as in the bundle
        report["venv"] = measure([str(Path(args.venv).resolve() / "bin" / "python"), "-m", "app"], args.repeat)
    report["load_after"] = os.getloadavg()[0]
    if max(report["load_before"], report["load_after"]) > 2:
        report["note"] = "load average above 2 during the run: the times are not comparable"
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
