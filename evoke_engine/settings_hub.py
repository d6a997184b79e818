"""The engine's current settings and who hears of a change: `apply` swaps the frozen value and calls each
subscriber whose fields changed (qutebrowser's `config.changed` with a `change_filter`).

Invariants: `current` is an immutable `Settings`, replaced whole (any thread may read it; only the engine
thread calls `apply`; any thread may subscribe or cancel); a subscriber runs once per `apply` in which one of its
fields changed, with (old, new), after the swap, in subscription order; a failing subscriber does not keep the
others from running (the first error is raised once all ran); a cancelled subscription is never called again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .settings import Settings

log = logging.getLogger(__name__)

SettingsCallback = Callable[[Settings, Settings], None]
_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))


@dataclass(frozen=True, eq=False)
class Subscription:
    """A receipt: `cancel` it when the subscriber goes away (a closed model, a shut-down scheduler)."""

    hub: SettingsHub
    callback: SettingsCallback
    fields: frozenset[str] | None            # None: every change

    def wants(self, changed: Iterable[str]) -> bool:
        return self.fields is None or not self.fields.isdisjoint(changed)

    def cancel(self) -> None:
        self.hub._cancel(self)


class SettingsHub:
    def __init__(self, settings: Settings) -> None:
        self._current = settings
        self._subscriptions: list[Subscription] = []
        self._lock = threading.Lock()                # guards the list: the scheduler subscribes off the thread

    @property
    def current(self) -> Settings:
        return self._current

    def subscribe(self, callback: SettingsCallback, fields: Iterable[str] | None = None) -> Subscription:
        """Call `callback(old, new)` after each change of one of `fields` (None: of any setting)."""
        wanted = None if fields is None else frozenset(fields)
        unknown = sorted(wanted - _NAMES) if wanted is not None else []
        if unknown:
            raise ValueError(f"no such settings: {', '.join(unknown)}")
        subscription = Subscription(self, callback, wanted)
        with self._lock:
            self._subscriptions.append(subscription)
        return subscription

    def _cancel(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    def _subscribed(self) -> list[Subscription]:
        with self._lock:
            return list(self._subscriptions)

    def subscribers(self, field: str) -> int:
        """How many subscribers hear of a change of `field` (tests, diagnostics)."""
        return sum(s.wants((field,)) for s in self._subscribed())

    def apply(self, new: Settings) -> list[str]:
        """Make `new` the current settings and notify the subscribers of what changed (engine thread).
        Returns the names that changed (none: nobody is called)."""
        old = self._current
        changed = new.changed(old)
        if not changed:
            return []
        self._current = new
        error: BaseException | None = None
        for subscription in self._subscribed():
            if subscription not in self._subscribed() or not subscription.wants(changed):
                continue                               # cancelled by an earlier subscriber, or not its fields
            try:
                subscription.callback(old, new)
            except Exception as exc:  # noqa: BLE001 - the others still hear of the change; raised below
                log.exception("settings subscriber %r failed", subscription.callback)
                error = error or exc
        if error is not None:
            raise error
        return changed
