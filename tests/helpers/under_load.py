"""Runs a command while every core is kept busy (`make test-loaded`): the suite's timing-dependent tests meet the
load a CI machine doing other work gives them. One burner process a core, ended with the command.

Usage: python tests/helpers/under_load.py [--repeat N] [--burners N] -- COMMAND...  The exit status is the first
failing run's (0 when all N runs pass); each run's status and duration are printed, and the runs stop at a failure
unless --keep-going.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def burn() -> None:  # pragma: no cover - runs in a child process until terminated
    # at the suite's own priority: real contention for the cores, not idle time
    x = 0
    while True:
        x = (x * 1_103_515_245 + 12_345) & 0xFFFF_FFFF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="run the command this many times (default 1)")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2,
                        help="busy processes, default one a core")
    parser.add_argument("--keep-going", action="store_true", help="run every repeat even after a failure")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for process in burners:
        process.start()
    first_failure = 0
    try:
        for run in range(1, args.repeat + 1):
            started = time.monotonic()
            status = subprocess.call(command)
            load = os.getloadavg()[0]
            print(f"under_load: run {run}/{args.repeat}: exit {status} in {time.monotonic() - started:.0f} s "
                  f"({args.burners} burners, load {load:.1f})", flush=True)
            if status and not first_failure:
                first_failure = status
                if not args.keep_going:
                    break
    finally:
        for process in burners:
            process.terminate()
        for process in burners:
            process.join(5)
    return first_failure


if __name__ == "__main__":
    sys.exit(main())
