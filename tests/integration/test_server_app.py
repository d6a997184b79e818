"""The window's endpoint pieces (no model needed): the switch starts, moves and stops the server as the
settings say and reports its address; the status bar shows it; API conversations carry a mark."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import httpx
import pytest

from evoke_engine import Settings

pytestmark = pytest.mark.gui


def test_switch_follows_the_settings(qtbot, tmp_path):
    from app.endpoint_switch import EndpointSwitch

    loaded: Future = Future()
    loaded.set_result(None)
    listeners: list = []                               # the running server's engine-event listeners
    engine = SimpleNamespace(settings=Settings(home=str(tmp_path)), model_loaded=True,   # /health reads only these
                             ready=loaded, subscribe=listeners.append, unsubscribe=listeners.remove)
    switch = EndpointSwitch()
    seen: list[str] = []
    switch.addressChanged.connect(seen.append)
    off = Settings(home=str(tmp_path))
    switch.apply(engine, off)
    assert seen == [] and switch.server is None
    on = off.replace(server_enabled=True, server_port=0)
    try:
        switch.apply(engine, on)
        assert seen[-1].startswith("http://127.0.0.1:") and seen[-1].endswith("/v1")
        switch.server.wait_started()
        health = httpx.get(seen[-1].removesuffix("/v1") + "/health", timeout=30)
        assert health.json() == {"status": "ok", "model_loaded": True}
        per_server = len(listeners)                    # /metrics' counters and the service's usage clock
        assert per_server >= 1
        switch.apply(engine, on)                       # unchanged settings: the same server keeps running
        assert len(seen) == 1
        switch.apply(engine, on.replace(api_key="k"))   # a new key: restarted with it
        switch.server.wait_started()
        assert httpx.get(seen[-1] + "/models", timeout=30).status_code == 401
        assert len(listeners) == per_server             # the stopped server's listeners left with it
    finally:
        switch.apply(engine, off)
    assert seen[-1] == "" and switch.server is None and listeners == []


def test_switch_reports_a_refused_address(qtbot, tmp_path):
    from app.endpoint_switch import EndpointSwitch

    engine = SimpleNamespace(settings=Settings(home=str(tmp_path)), model_loaded=True)
    switch = EndpointSwitch()
    failures: list[str] = []
    switch.failed.connect(failures.append)
    switch.apply(engine, Settings(home=str(tmp_path), server_enabled=True, server_host="0.0.0.0"))
    assert switch.server is None and "allow-remote" in failures[0]


def test_status_bar_and_api_mark(qtbot):
    from app.item_models import ConversationListModel, SourceRole
    from app.widgets.status_bar import StatusBar

    bar = StatusBar()
    qtbot.addWidget(bar)
    bar.set_endpoint("http://127.0.0.1:8765/v1")
    assert bar.endpoint.text() == "API http://127.0.0.1:8765/v1" and not bar.endpoint.isHidden()
    bar.set_endpoint("")
    assert bar.endpoint.isHidden()
    model = ConversationListModel()
    model.set_conversations([SimpleNamespace(id="a", title="from a tool", updated_at=2.0, pinned=False,
                                             memory="slot", source="api"),
                             SimpleNamespace(id="b", title="mine", updated_at=1.0, pinned=False, memory="none")])
    assert [model.data(model.index(i), SourceRole) for i in range(2)] == ["api", "app"]
