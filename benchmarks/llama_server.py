"""A llama-server process as a bench comparator: start on 127.0.0.1, time the first streamed token, stop.

Invariants: the bench builds nothing (the binary comes from `--server PATH`, see
native/build_llama_server.sh); the process is always stopped (on Linux also when the bench is killed), and binds
to loopback only.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evoke_engine.runtime.runtime import cpu_has_amx, default_model_path


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the bench that started it dies, even killed -9."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`with LlamaServer(binary, n_ctx=..., args=[...]) as server:` — stopped on exit, even on error."""

    def __init__(self, binary: str, *, n_ctx: int, threads: int, args: list[str] = (),
                 slot_save_path: str | None = None) -> None:
        self.binary, self.n_ctx, self.threads = binary, n_ctx, threads
        self.args, self.slot_save_path = list(args), slot_save_path
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        # open for the process's lifetime (closed in __exit__), kept on disk for a failed start's message
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115

    def __enter__(self) -> LlamaServer:
        cmd = [self.binary, "-m", str(default_model_path()), "--host", "127.0.0.1", "--port", str(self.port),
               "-c", str(self.n_ctx), "-t", str(self.threads), "-tb", str(self.threads), "--no-webui", *self.args]
        if cpu_has_amx():
            cmd.append("--no-repack")          # the same AMX guard as the engine (llama.cpp issue 20824)
        if self.slot_save_path:
            cmd += ["--slot-save-path", self.slot_save_path]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); log: {self.log.name}")
            try:
                if self._request("GET", "/health")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"llama-server did not become healthy in 120 s; log: {self.log.name}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log.close()

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, (json.loads(data) if data.strip().startswith(b"{") else {})
        finally:
            conn.close()

    def ttft(self, messages: list[dict], slot: int | None = None) -> float:
        """Seconds from the request to the first streamed content piece of a chat completion."""
        body = {"messages": messages, "max_tokens": 2, "temperature": 0, "stream": True, "cache_prompt": True}
        if slot is not None:
            body["id_slot"] = slot
        streamed = self.stream(body, timeout=600)
        return streamed["ttft_s"] if streamed["ttft_s"] is not None else streamed["total_s"]

    def stream(self, body: dict, *, timeout: float = 1800) -> dict:
        """One streamed chat completion (`body` sets `"stream": True`): the seconds to its first content piece
        (None when it streamed none) and to its end, the text, the clock time of each content piece, and the
        server's last `usage` and `timings`."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            start = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"llama-server answered {resp.status}: {resp.read()[:300]!r}")
            times, pieces, usage, timings = [], [], {}, {}
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        times.append(time.perf_counter())
                        pieces.append(choice["delta"]["content"])
            return {"ttft_s": times[0] - start if times else None, "total_s": time.perf_counter() - start,
                    "text": "".join(pieces), "piece_times": times, "usage": usage, "timings": timings}
        finally:
            conn.close()

    def slot_action(self, slot: int, action: str, filename: str) -> float:
        """save / restore a slot through --slot-save-path; returns the seconds the call took."""
        start = time.perf_counter()
        status, body = self._request("POST", f"/slots/{slot}?action={action}", {"filename": filename})
        if status != 200:
            raise RuntimeError(f"slot {action} failed ({status}): {body}")
        return time.perf_counter() - start


def check_binary(path: str | None) -> str | None:
    """The server binary to use, or None (its rows are skipped); a wrong path is an error."""
    if not path:
        return None
    binary = Path(path)
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise SystemExit(f"--server {path}: not an executable file (build one with native/build_llama_server.sh)")
    return str(binary.resolve())
