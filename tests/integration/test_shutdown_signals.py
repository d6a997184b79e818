"""Issue 41, item 3: SIGTERM, SIGINT and SIGHUP stop `serve` and the window cleanly, as processes on the embedded
model: exit status 0, the engine closed, and the KV file of the conversation that was open written to the data
folder (before: `serve` died of the re-raised signal, status 143, nothing saved; `--lifetime` ended in a traceback).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers.processes import Child, environment

ROOT = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"endpoint on (http://\S+/v1)")
LONG_REPLY = "Write a long story about a lighthouse keeper and a storm, at least three paragraphs."


def kv_files(home: Path, conversation_id: str) -> list[Path]:
    """The conversation's KV files under the home (the cache folder holds them)."""
    return sorted(home.rglob(f"{conversation_id}.*.bin"))


def start_serve(home: Path, *extra: str) -> tuple[Child, str]:
    child = Child([sys.executable, "-m", "evoke_engine", "serve", "--port", "0", *extra], home)
    return child, child.wait_for(STARTED.pattern).group(1)


def test_serve_stopped_by_sigterm_mid_reply_exits_0_and_writes_the_kv_file(tmp_path):
    child, address = start_serve(tmp_path)
    body = {"model": "evoke", "stream": True, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": LONG_REPLY}]}
    pieces = []
    with httpx.stream("POST", f"{address}/chat/completions", json=body, timeout=120,
                      headers={"X-Evoke-Session": "sigterm-test"}) as response:
        conversation_id = response.headers["X-Evoke-Conversation"]
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                pieces.append(line)
                if len(pieces) == 3:
                    child.proc.send_signal(signal.SIGTERM)       # mid-reply
            if line == "data: [DONE]":
                break
    code, stderr = child.stop_with(signal.SIGTERM)          # a second SIGTERM during the close changes nothing
    assert code == 0, stderr
    assert "stopping the endpoint (SIGTERM)" in child.lines and "endpoint stopped" in child.lines
    assert "Traceback" not in stderr
    assert kv_files(tmp_path, conversation_id), f"no KV file for {conversation_id} under {tmp_path}"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_serve_stopped_by_sigint_or_sighup_after_a_reply_exits_0_and_writes_the_kv_file(tmp_path, signum):
    child, address = start_serve(tmp_path)
    reply = httpx.post(f"{address}/chat/completions", timeout=120, headers={"X-Evoke-Session": "signal-test"},
                       json={"model": "evoke", "max_tokens": 8, "temperature": 0,
                             "messages": [{"role": "user", "content": "Say hello."}]})
    assert reply.status_code == 200, reply.text
    code, stderr = child.stop_with(signum)
    assert code == 0, stderr
    assert f"stopping the endpoint ({signal.Signals(signum).name})" in child.lines
    assert kv_files(tmp_path, reply.headers["X-Evoke-Conversation"])


def test_serve_with_a_lifetime_stops_by_itself_with_status_0(tmp_path):
    done = subprocess.run([sys.executable, "-m", "evoke_engine", "serve", "--port", "0", "--lifetime", "1"],
                          cwd=ROOT, env=environment(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "stopping the endpoint (lifetime over)" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize(("signum", "when", "max_tokens"), [(signal.SIGTERM, "REPLIED", 8),
                                                            (signal.SIGHUP, "STREAMING", 400)])
def test_the_window_closes_on_a_signal_with_status_0_and_writes_the_kv_file(tmp_path, signum, when, max_tokens):
    child = Child([sys.executable, str(ROOT / "tests" / "helpers" / "window_child.py"), LONG_REPLY,
                   str(max_tokens)], tmp_path)
    conversation_id = child.wait_for(rf"^{when} (\w+)").group(1)
    code, stderr = child.stop_with(signum)
    assert code == 0, stderr
    assert f"{signal.Signals(signum).name} received: closing the window" in stderr
    assert kv_files(tmp_path, conversation_id), stderr[-3000:]
