"""Issue 60: models from the hub without the internet. A local fake hub (tests/helpers/fake_hub.py, reached through
HF_ENDPOINT) serves the embedded SmolLM2 GGUF under another repository name; `huggingface_hub` lists it, and the
download lands verified in the models folder: with progress, resumed after a dropped connection (only the missing
bytes asked for), refused on a wrong sha256 or a full disk with nothing left behind, cancelled leaving nothing, and
offline with a message naming the endpoint. The end-to-end case runs `pull` and chats with the pulled file."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers.fake_hub import FakeHub
from helpers.processes import ROOT, environment

from evoke_engine.models import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadCancelled,
    DownloadInterruptedError,
    HubNotFoundError,
    HubUnreachableError,
    list_gguf_files,
    load_catalogue,
    local_models,
    pull,
    search_gguf,
)
from evoke_engine.models.download import destination, partial_path
from evoke_engine.runtime.model_file import default_model_path

REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture(scope="module")
def model_bytes() -> tuple[int, str]:
    path = default_model_path()
    return path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def hub(monkeypatch):
    """The fake hub with the embedded model as REPO/FILE; huggingface_hub pointed at it and online."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)   # read once at its import
    with FakeHub() as server:
        server.add_file(REPO, FILE, default_model_path())
        server.add_file(REPO, "SmolLM2-135M-Instruct-mmproj-f16.gguf", b"not a model")
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def visible_files(folder) -> list:
    """Every file under the models folder outside the hidden partial folder (what a model list could show)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and ".partial" not in p.parts) if folder.exists() else []


def test_the_hub_lists_the_repository_s_gguf_files_with_size_and_lfs_sha256(hub, tmp_path, model_bytes):
    size, sha = model_bytes
    listing = list_gguf_files(REPO)
    assert [(f.path, f.size_bytes, f.sha256, f.quant) for f in listing.files] == [(FILE, size, sha, "Q4_1")]
    assert listing.commit and len(listing.commit) == 40
    assert [r.repo for r in search_gguf("smollm2")] == [REPO]
    assert search_gguf("no-such-thing") == []
    with pytest.raises(HubNotFoundError, match="test-org/nothing is not on the hub at http://127.0.0.1"):
        list_gguf_files("test-org/nothing")
    with pytest.raises(HubNotFoundError, match="no Q8_0 file; its quants: Q4_1"):
        pull(f"{REPO}:Q8_0", tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_a_pull_lands_verified_in_the_models_folder_with_progress(hub, tmp_path, model_bytes):
    size, sha = model_bytes
    seen = []
    pulled = pull(f"{REPO}:Q4_1", tmp_path / "models", on_progress=seen.append)
    assert pulled.path == destination(tmp_path / "models", REPO, FILE) == tmp_path / "models" / REPO / FILE
    assert pulled.sha256 == sha and pulled.size_bytes == size and not pulled.already_present
    assert hashlib.sha256(pulled.path.read_bytes()).hexdigest() == sha
    done = [p.done_bytes for p in seen]
    assert done == sorted(done) and done[-1] == size and all(p.total_bytes == size for p in seen)
    assert seen[-1].fraction == 1.0 and seen[-1].speed_bps > 0 and seen[-1].eta_s == 0
    assert visible_files(tmp_path / "models") == [pulled.path]
    assert not (tmp_path / "models" / ".partial").exists(), "the partial folder is removed once empty"
    assert [m.path for m in local_models(tmp_path / "models")] == [pulled.path]
    content = hub.content_requests()
    assert len(content) == 1 and content[0].range is None and content[0].body_bytes == size
    again = pull(f"{REPO}:Q4_1", tmp_path / "models")               # a second pull finds it there
    assert again.already_present and again.path == pulled.path and len(hub.content_requests()) == 1


def test_a_dropped_connection_resumes_and_downloads_only_the_rest(hub, tmp_path, model_bytes):
    size, sha = model_bytes
    folder, cut = tmp_path / "models", 40_000_000
    hub.drop_after = cut
    with pytest.raises(DownloadInterruptedError, match="pull it again to resume"):
        pull(REPO, folder, max_retries=0)                    # gives up at once: as if the process were killed
    part = partial_path(folder, REPO, FILE)
    assert part.stat().st_size == cut
    assert visible_files(folder) == [] and local_models(folder) == []      # never shown as a model
    from app.model_finder import find_models
    assert [m.path for m in find_models(roots=[("Evoke Desk models", folder)])] == [None]

    pulled = pull(REPO, folder)
    first, second = hub.content_requests()
    assert first.body_bytes == cut and first.range is None
    assert second.range == f"bytes={cut}-" and second.status == 206 and second.body_bytes == size - cut
    assert pulled.resumed_from == cut and pulled.sha256 == sha
    assert hashlib.sha256(pulled.path.read_bytes()).hexdigest() == sha
    assert not part.exists() and visible_files(folder) == [pulled.path]


def test_a_killed_pull_resumes_from_what_reached_the_disk(hub, tmp_path, model_bytes):
    """`evoke-desk pull` SIGKILLed half-way keeps its partial; the next pull asks only for the bytes after it."""
    size, sha = model_bytes
    folder = tmp_path / "data" / "models"
    part = partial_path(folder, REPO, FILE)
    hub.chunk_delay_s = 0.02                                   # about 12 MB/s: seconds to kill it in
    env = {k: v for k, v in environment(tmp_path).items() if k != "HF_HUB_OFFLINE"}
    child = subprocess.Popen([sys.executable, "-m", "evoke_engine", "pull", REPO], cwd=ROOT,
                             env={**env, "HF_ENDPOINT": hub.url}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size > 10_000_000):
            assert child.poll() is None and time.monotonic() < deadline, "the pull ended or stalled"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    kept = part.stat().st_size
    assert 10_000_000 < kept < size and visible_files(folder) == []
    hub.chunk_delay_s = 0.0
    pulled = pull(REPO, folder)
    resumed = hub.content_requests()[-1]
    assert resumed.range == f"bytes={kept}-" and resumed.body_bytes == size - kept
    assert pulled.resumed_from == kept and pulled.sha256 == sha
    assert hashlib.sha256(pulled.path.read_bytes()).hexdigest() == sha and not part.exists()


def test_a_drop_mid_download_is_retried_in_the_same_pull(hub, tmp_path, model_bytes):
    size, sha = model_bytes
    hub.drop_after = 12_345_678
    pulled = pull(REPO, tmp_path / "models", retry_wait_s=0.01)
    ranges = [(r.range, r.body_bytes) for r in hub.content_requests()]
    assert ranges == [(None, 12_345_678), ("bytes=12345678-", size - 12_345_678)]
    assert pulled.sha256 == sha


def test_a_partial_of_another_version_or_a_server_ignoring_range_starts_over(hub, tmp_path, model_bytes):
    size, sha = model_bytes
    folder = tmp_path / "models"
    part = partial_path(folder, REPO, FILE)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 1000)                             # from a file the hub has since replaced
    part.with_name(part.name + ".json").write_text(json.dumps({"sha256": "0" * 64, "size": size}))
    assert pull(REPO, folder).sha256 == sha
    assert [(r.range, r.body_bytes) for r in hub.content_requests()] == [(None, size)]

    other = tmp_path / "other"
    hub.drop_after, hub.ignore_range = 5_000_000, True
    pulled = pull(REPO, other, retry_wait_s=0.01)
    assert [(r.range, r.status, r.body_bytes) for r in hub.content_requests()[1:]] == [
        (None, 200, 5_000_000), ("bytes=5000000-", 200, size)]
    assert pulled.sha256 == sha and hashlib.sha256(pulled.path.read_bytes()).hexdigest() == sha


def test_a_wrong_sha256_is_refused_with_nothing_left_behind(hub, tmp_path):
    hub.corrupt = True
    with pytest.raises(ChecksumMismatchError, match=f"{FILE} arrived damaged.*Nothing was kept"):
        pull(REPO, tmp_path / "models")
    assert visible_files(tmp_path / "models") == []
    assert not (tmp_path / "models" / ".partial").exists()


def test_a_disk_too_small_is_refused_before_writing(hub, tmp_path, model_bytes):
    size, _ = model_bytes
    asked = []

    def small_disk(folder):
        asked.append(folder)
        return size // 2

    with pytest.raises(DiskSpaceError, match=r"not enough disk space in .*models: the download needs 93\.8 MiB "
                                             r"\(and 16\.0 MiB to spare\), 46\.9 MiB is free"):
        pull(REPO, tmp_path / "models", free_space=small_disk)
    assert asked == [tmp_path / "models"]
    assert hub.content_requests() == [] and not (tmp_path / "models").exists()


def test_cancel_leaves_nothing(hub, tmp_path):
    cancel = threading.Event()
    seen = []

    def progress(p):
        seen.append(p)
        cancel.set()                                   # the dialog's Cancel button, pressed at the first report

    with pytest.raises(DownloadCancelled):
        pull(REPO, tmp_path / "models", on_progress=progress, cancel=cancel)
    assert seen and seen[-1].done_bytes < seen[-1].total_bytes
    assert list((tmp_path / "models").rglob("*")) == []


def test_offline_says_which_endpoint_it_could_not_reach(hub, tmp_path, monkeypatch):
    import huggingface_hub.constants

    url = hub.url
    hub.stop()
    with pytest.raises(HubUnreachableError, match=f"cannot reach the model hub at {url}:.*Models already on disk"):
        pull(REPO, tmp_path / "models")
    with pytest.raises(HubUnreachableError, match=f"cannot reach the model hub at {url}"):
        search_gguf("smol")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachableError, match="offline mode is on \\(HF_HUB_OFFLINE is set\\)"):
        list_gguf_files(REPO)
    assert not (tmp_path / "models").exists()


def _cli(args: list[str], home, hub_url: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in environment(home).items() if k != "HF_HUB_OFFLINE"}
    if hub_url:
        env["HF_ENDPOINT"] = hub_url
    return subprocess.run([sys.executable, "-m", "evoke_engine", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_pull_from_the_hub_then_a_first_reply_from_the_pulled_file(hub, tmp_path, model_bytes):
    """`evoke-desk pull` (its engine entry point) from the fake hub, `models` marks the file, the engine loads it."""
    from evoke_engine import Engine, Settings

    done = _cli(["pull", f"{REPO}:Q4_1"], tmp_path, hub.url)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "data" / "models" / REPO / FILE
    assert done.stdout.strip().splitlines()[-1] == str(path)
    assert "100.0%" in done.stderr and "verified sha256" in done.stderr
    assert hashlib.sha256(path.read_bytes()).hexdigest() == model_bytes[1]

    listed = _cli(["models"], tmp_path, None)
    assert listed.returncode == 0, listed.stderr
    assert f"On disk in {tmp_path / 'data' / 'models'}:" in listed.stdout and f"{REPO}/{FILE}" in listed.stdout
    files = _cli(["models", "--files", REPO], tmp_path, hub.url)
    assert files.returncode == 0 and f"* {FILE}" in files.stdout

    with Engine(Settings(home=str(tmp_path), model_path=str(path), n_ctx=2048, slots=1), prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        reply = conv.send("Say hello.", max_tokens=12, temperature=0)
    assert reply.strip()


def test_pull_offline_says_so_and_models_still_lists_the_catalogue(hub, tmp_path):
    url = hub.url
    hub.stop()
    done = _cli(["pull", REPO], tmp_path, url)
    assert done.returncode == 2 and f"error: cannot reach the model hub at {url}" in done.stderr
    listed = _cli(["models"], tmp_path, url)
    assert listed.returncode == 0 and all(m.id in listed.stdout for m in load_catalogue().models)
    searched = _cli(["models", "--search", "coder"], tmp_path, url)
    assert searched.returncode == 2 and "cannot reach the model hub" in searched.stderr
