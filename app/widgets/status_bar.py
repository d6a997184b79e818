"""The status bar: model and device, tokens/s, time to first token, and the active-KV gauge.

Invariant: it only formats what the controller reports; the gauge turns amber above the high
watermark and red over the budget; it says "Ready" only while no conversation is opening (a rebuild
shows its progress and a Cancel button that emits `cancelRebuild`). A long state, model, device or endpoint text
is cut with "…" (whole in its tooltip): the bar never sets the window's minimum width.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QToolButton, QWidget

from ..messages import model_name
from .elided_label import ElidedLabel


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def device_summary(info: Any) -> str:
    """One line for the status bar: the device, the GPU layers and what the model holds in VRAM; with remote
    devices (RPC), the layers on each device."""
    shares = getattr(info, "devices", ()) or ()
    if shares:
        return "Layers: " + " · ".join(f"{d.name} {d.layers}" for d in shares)
    if getattr(info, "device_kind", "cpu") != "cuda":
        return "CPU (GPU not used)" if getattr(info, "device_notice", "") else "CPU"
    name = getattr(info, "device", "GPU").split(" (")[0]
    used = getattr(info, "vram_weights_bytes", 0) + getattr(info, "vram_kv_bytes", 0)
    layers, total = getattr(info, "n_gpu_layers", 0), getattr(info, "n_layer", 0)
    shown = f"{layers} of {total} layers" if total and 0 <= layers < total else f"{layers} layers"
    auto = " (auto)" if getattr(info, "gpu_layers_reason", "").startswith("auto") else ""
    return f"{name} · {shown}{auto} · VRAM {_gib(used)}"


def device_details(info: Any) -> str:
    """The tooltip and Settings → Model text: device, VRAM split, and any fallback notice."""
    lines = [f"Device: {getattr(info, 'device', 'CPU')}"]
    if getattr(info, "gpu_layers_reason", ""):
        lines.append(f"GPU layers chosen: {info.gpu_layers_reason}")
    if getattr(info, "device_kind", "cpu") == "cuda":
        lines += [f"GPU layers: {getattr(info, 'n_gpu_layers', 0)} of {getattr(info, 'n_layer', '?')}",
                  f"VRAM: weights {_gib(getattr(info, 'vram_weights_bytes', 0))}, "
                  f"KV cache {_gib(getattr(info, 'vram_kv_bytes', 0))}; "
                  f"{_gib(getattr(info, 'vram_free_bytes', 0))} free of "
                  f"{_gib(getattr(info, 'vram_total_bytes', 0))}"]
    for share in getattr(info, "devices", ()) or ():
        where = f"remote {share.endpoint}" if share.endpoint else "this machine"
        lines.append(f"{share.name} ({where}): {share.layers} layers; {_gib(share.free_bytes)} free of "
                     f"{_gib(share.total_bytes)}")
    if getattr(info, "device_notice", ""):
        lines.append(info.device_notice)
    return "\n".join(lines)


READ_ONLY_TEXT = "Read-only: another window owns this data folder"


class StatusBar(QStatusBar):
    cancelRebuild = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("statusBar")
        self.state = ElidedLabel("Loading model…", objectName="statusState")   # long texts cut, never widen
        self.busy = QProgressBar(objectName="busy", maximumWidth=120, maximumHeight=12, textVisible=False)
        self.busy.setRange(0, 0)
        self.cancel = QToolButton(text="Cancel", objectName="cancelRebuild", visible=False)
        self.cancel.setToolTip("Stop rebuilding this conversation from its history (it is rebuilt when you send)")
        self.cancel.clicked.connect(self.cancelRebuild)
        self.model = ElidedLabel("", objectName="statusModel")
        self.device = ElidedLabel("", objectName="statusDevice")
        self.speed = QLabel("— tok/s", objectName="statusSpeed")
        self.ttft = QLabel("TTFT —", objectName="statusTtft")
        self.endpoint = ElidedLabel("", objectName="statusEndpoint", visible=False)
        self.recall = ElidedLabel("", objectName="statusRecall", visible=False)   # the recall model, until ready
        self.gauge = QProgressBar(objectName="gauge", minimumWidth=220, maximumWidth=280, maximumHeight=16)
        self.gauge.setFormat("KV 0 / 0")
        self.gauge.setRange(0, 1)
        self.gauge.setValue(0)
        self.addWidget(self.state)
        self.addWidget(self.busy)
        self.addWidget(self.cancel)
        for widget in (self.recall, self.endpoint, self.model, self.device, self.speed, self.ttft, self.gauge):
            self.addPermanentWidget(widget)
        self.high_watermark = 0.92
        self.active = self.budget = 0
        self.opening = ""                          # the conversation whose KV is opening ("" when none)

    def idle_text(self) -> str:
        """What the bar says when nothing runs: "Ready" once the shown conversation is open."""
        return f"Opening “{self.opening}”…" if self.opening else "Ready"

    def set_opening(self, title: str) -> None:
        """`title`'s KV is opening ("" once the shown conversation is open): the idle text follows it."""
        text, idle = self.state.text(), self.idle_text()
        self.opening = title
        if text.startswith("Rebuilding"):              # that rebuild ended (done, cancelled or left)
            self.busy.setVisible(False)
            self.cancel.setVisible(False)
        if text == idle or text.startswith("Rebuilding"):
            self.state.setText(self.idle_text())

    def set_model_state(self, state: str, detail: str) -> None:
        text = {"loading": detail or "Loading model…", "ready": self.idle_text(), "failed": "Model failed to load",
                "read-only": READ_ONLY_TEXT,
                "unloaded": "Model unloaded (idle); it reloads on the next message"}.get(state, detail)
        self.state.setText(text)
        self.busy.setVisible(state == "loading")
        if state == "loading":
            self.busy.setRange(0, 0)

    def set_endpoint(self, address: str) -> None:
        """The OpenAI-compatible endpoint's base URL while it runs (hidden when off)."""
        self.endpoint.setText(f"API {address}" if address else "")
        self.endpoint.setToolTip("OpenAI-compatible endpoint: point coding tools at this base URL" if address else "")
        self.endpoint.setVisible(bool(address))

    def set_model_info(self, info: Any) -> None:
        self.model.setText(model_name(info))
        self.model.setToolTip(f"{getattr(info, 'path', '')}\n{getattr(info, 'description', '')}\n"
                              f"context {getattr(info, 'n_ctx', '?')} · KV {getattr(info, 'kv_cache_type', '?')}")
        self.device.setText(device_summary(info))
        self.device.setToolTip(device_details(info))
        notice = getattr(info, "device_notice", "")
        self.device.setProperty("level", "notice" if notice else "ok")
        if notice:
            self.showMessage(notice, 15000)

    def set_recall_model(self, state: str, first_use: bool, message: str) -> None:
        """The recall model (the embedder) warming up: a mark until it is ready; a failure stays marked."""
        words = {"warming": "Recall: preparing (first use)…" if first_use else "Recall: loading…",
                 "failed": "Recall: by words only"}.get(state, "")
        self.recall.setText(words)
        self.recall.setToolTip(message[:1].upper() + message[1:] if words else "")
        self.recall.setVisible(bool(words))
        if state == "ready":
            self.showMessage(message[:1].upper() + message[1:], 5000)

    def set_prefill(self, done: int, message: str) -> None:
        self.state.setText(f"Prefill {message or done}")
        self.busy.setVisible(True)
        try:
            got, total = (int(x) for x in message.split("/"))
            self.busy.setRange(0, total)
            self.busy.setValue(got)
        except ValueError:
            self.busy.setRange(0, 0)

    def set_rebuild(self, title: str, done: int, total: int) -> None:
        if done >= total:
            self.state.setText(self.idle_text())
            self.busy.setVisible(False)
            self.cancel.setVisible(False)
            return
        self.state.setText(f"Rebuilding “{title}” from history: {done:,}/{total:,} tokens")
        self.busy.setVisible(True)
        self.cancel.setVisible(True)
        self.busy.setRange(0, total)
        self.busy.setValue(done)

    def set_generating(self, generating: bool) -> None:
        self.state.setText("Generating…" if generating else self.idle_text())
        self.busy.setVisible(generating)
        self.busy.setRange(0, 0)

    def set_metrics(self, ttft: float, rate: float) -> None:
        self.speed.setText(f"{rate:.1f} tok/s")
        self.ttft.setText(f"TTFT {ttft * 1000:.0f} ms" if ttft < 10 else f"TTFT {ttft:.1f} s")

    def set_stats(self, stats: dict[str, Any]) -> None:
        if not int(stats.get("budget_tokens", 0) or 0):          # not open in the engine (an import not loaded yet)
            self.active = self.budget = 0
            self.gauge.setRange(0, 1)
            self.gauge.setValue(0)
            messages, chars = int(stats.get("history_messages", 0)), int(stats.get("history_chars", 0))
            self.gauge.setFormat(f"Not loaded · {messages} messages, {chars:,} chars" if messages else "Not loaded")
            self.gauge.setProperty("level", "ok")
            return
        self.active = int(stats.get("active_tokens", 0))
        self.budget = max(1, int(stats.get("budget_tokens", 1)))
        self.gauge.setRange(0, self.budget)
        self.gauge.setValue(min(self.active, self.budget))
        self.gauge.setFormat(f"KV {self.active} / {self.budget} tokens")
        level = "over" if self.active > self.budget else (
            "high" if self.active > self.budget * self.high_watermark else "ok")
        self.gauge.setProperty("level", level)
        self.gauge.style().unpolish(self.gauge)
        self.gauge.style().polish(self.gauge)
