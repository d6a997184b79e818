"""An RPC worker from this install: llama.cpp's rpc-server (native/build_rpc_server.sh builds it against the
installed llama-cpp-python), started for `evoke-desk rpc-worker`, the tests and `bench --rpc auto`.

Invariants: a worker binds to loopback unless the caller passes `allow_remote` (and then a warning that llama.cpp's
RPC protocol has no authentication or encryption is printed); `LocalWorkers` stops every worker it started, even
when its body raises, and a worker started here dies with the process that started it; a worker is ready when its
port accepts a connection, or it failed and its output says why.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..package_files import RPC_SERVER, native_library, native_missing_note
from ..rpc_split import DEFAULT_WORKER_PORT, parse_endpoints
from . import device
from .rpc import NO_SECURITY, probe

BINARY = RPC_SERVER
READY_TIMEOUT_S = 30.0


class WorkerError(RuntimeError):
    """A worker could not be started (no binary, a port in use, a refused address)."""


def binary_path() -> Path:
    path = native_library(BINARY)
    if path is None:
        raise WorkerError(native_missing_note(BINARY).replace("native/build.sh", "native/build_rpc_server.sh"))
    return path


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def worker_environment() -> dict[str, str]:
    """The worker's environment: llama.cpp's run-time backends (a CUDA build) are found in its library folder
    (the working directory), libggml there too and the CUDA runtime from PyPI's NVIDIA packages on LD_LIBRARY_PATH
    (the binary's own run path names the build machine's venv, which a PyInstaller bundle elsewhere lacks)."""
    env = dict(os.environ)
    extra = [str(device.LLAMA_LIB_DIR)]
    extra += [str(p) for p in device.nvidia_library_dirs()] if device.cuda_build() else []
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*extra, *filter(None, [env.get("LD_LIBRARY_PATH", "")])])
    return env


def command(host: str, port: int, *, threads: int = 0, cache: bool = False) -> list[str]:
    cmd = [str(binary_path()), "--host", host, "--port", str(port)]
    if threads:
        cmd += ["--threads", str(threads)]
    if cache:
        cmd.append("--cache")
    return cmd


def start(host: str = "127.0.0.1", port: int = DEFAULT_WORKER_PORT, *, allow_remote: bool = False, threads: int = 0,
          cache: bool = False, stdout=None) -> subprocess.Popen:
    """Start a worker and wait until it listens; WorkerError says why it did not."""
    if not is_loopback(host) and not allow_remote:
        raise WorkerError(f"{host} is not a loopback address: pass --allow-remote to listen there ({NO_SECURITY})")
    if not probe(f"{host if host != '0.0.0.0' else '127.0.0.1'}:{port}", timeout=0.5):
        raise WorkerError(f"port {port} on {host} is already in use")
    proc = subprocess.Popen(command(host, port, threads=threads, cache=cache), cwd=device.LLAMA_LIB_DIR,
                            env=worker_environment(), stdout=stdout if stdout is not None else subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + READY_TIMEOUT_S
    target = f"{'127.0.0.1' if host in ('0.0.0.0', 'localhost') else host}:{port}"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise WorkerError(f"rpc-server exited with status {proc.returncode}: {output.strip()[-800:]}")
        if not probe(target, timeout=0.2):
            return proc
        time.sleep(0.05)
    stop(proc)
    raise WorkerError(f"rpc-server did not listen on {target} within {READY_TIMEOUT_S:g} s")


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a worker started here (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    if proc.stdout is not None:
        proc.stdout.close()


def _die_with_parent() -> None:
    """In the worker's child process, before exec: SIGTERM when the process that started it ends, even by a
    crash or SIGKILL (Linux prctl PR_SET_PDEATHSIG), so a test or bench that dies leaves no worker behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)        # PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalWorkers(contextlib.AbstractContextManager):
    """`count` workers on 127.0.0.1, each on a free port, each exposing this machine's device (the CPU here);
    `endpoints` lists them as the rpc_servers setting wants them. Stopped on exit."""

    def __init__(self, count: int = 2, *, threads: int = 0) -> None:
        self.procs: list[subprocess.Popen] = []
        self.endpoints: list[str] = []
        self._count, self._threads = count, threads

    def __enter__(self) -> LocalWorkers:
        try:
            for _ in range(self._count):
                port = free_port()
                self.procs.append(start("127.0.0.1", port, threads=self._threads, stdout=subprocess.DEVNULL))
                self.endpoints.append(f"127.0.0.1:{port}")
        except BaseException:
            self.close()
            raise
        return self

    def setting(self) -> str:
        return ",".join(self.endpoints)

    def kill(self, index: int) -> None:
        """Kill one worker at once (SIGKILL) and wait until it is gone: its connections are closed."""
        self.procs[index].kill()
        self.procs[index].wait(10)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)

    def __exit__(self, *exc) -> None:
        self.close()


def main(args) -> int:
    """`evoke-desk rpc-worker` / `python -m evoke_engine rpc-worker`: run a worker in the foreground."""
    host = args.host or "127.0.0.1"
    if not is_loopback(host):
        if not args.allow_remote:
            print(f"error: {host} is not a loopback address; add --allow-remote to listen there. {NO_SECURITY}.",
                  file=sys.stderr)
            return 2
        print(f"warning: listening on {host}:{args.port}. {NO_SECURITY}; anyone who reaches this port can run "
              "computations and read or write this worker's memory.", file=sys.stderr)
    try:
        cmd = command(host, args.port, threads=args.threads, cache=args.cache)
    except WorkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"rpc worker on {host}:{args.port}: add {host if is_loopback(host) else '<this machine>'}:{args.port} under "
          "Settings → Model → Remote devices (RPC) of the app. Ctrl-C stops it.", flush=True)
    proc = subprocess.Popen(cmd, cwd=device.LLAMA_LIB_DIR, env=worker_environment())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        return 0


def add_arguments(p) -> None:
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; another needs --allow-remote)")
    p.add_argument("--port", type=int, default=DEFAULT_WORKER_PORT, help=f"port (default {DEFAULT_WORKER_PORT})")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback address (no authentication, no encryption: trusted networks only)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of the worker's CPU device (default: half)")
    p.add_argument("--cache", action="store_true", help="cache received weights on this machine's disk (rpc-server -c)")


@contextlib.contextmanager
def bench_workers(spec: str | None, sets: int = 1, threads: int = 0):
    """Endpoint lists a bench splits models across, one per system (a worker serves one process at a time):
    `auto` starts `sets` pairs of workers on 127.0.0.1 (stopped after); an endpoint list is one set, as given;
    None gives none."""
    if not spec:
        yield []
    elif spec == "auto":
        with LocalWorkers(2 * sets, threads=threads) as workers:
            yield [",".join(workers.endpoints[2 * k:2 * k + 2]) for k in range(sets)]
    else:
        yield [",".join(parse_endpoints(spec))]


def even_split(endpoints: str) -> str:
    """The layer split that gives this machine and each endpoint an equal share."""
    return ",".join(["1"] * (len(parse_endpoints(endpoints)) + 1))
