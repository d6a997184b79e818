"""Applying settings from the dialog: what applies now goes to the engine at once, the rest reloads.

Also what is wrong with the saved settings at start-up: values of settings.json that were not used (the field,
the file, why) and a saved budget below the smallest that works, in the banner (topic "settings") with where to
change them.

Invariants: a reload that fails leaves the previous model and settings in place (and says so);
settings reach disk only once they took effect; settings are frozen values the window and the engine share (a
setting only the window reads, `apply_window_setting`, reaches the engine with the next settings applied); every
outcome is signalled: `settingsApplied` (then `errorResolved("settings")`) or `settingsFailed` with a readable reason.
"""

from __future__ import annotations

import logging
from typing import Any

from evoke_engine import min_budget_tokens, recovery_backend

from .bridge import error_text
from .messages import model_name
from .settings_form import budget_floor_text, changed, field_specs, file_problems_text

log = logging.getLogger(__name__)


def prefix_of_floor(smallest: int, settings: Any) -> int:
    """The prefix length for which `min_budget_tokens` gives `smallest` under `settings` (it grows strictly with
    the prefix, so the engine's answer names one prefix): the dialog applies the same rule to edited settings."""
    low, high = 0, smallest
    while low < high:
        middle = (low + high + 1) // 2
        if min_budget_tokens(middle, settings) <= smallest:
            low = middle
        else:
            high = middle - 1
    return low


class SettingsFlow:
    """Mixed into ChatController (uses its bridge, settings, conv, model state and signals)."""

    def apply_settings(self, new: Any) -> None:
        """Apply what applies now (the budget to the open conversation at once), reload for the rest."""
        old = self.settings
        if self.model_info is None and self.model_state == "failed":
            self.settings = new                 # no model ever loaded here: start a fresh engine on `new`
            self.bridge.restart(new)
            self._save(new)
            self._applied(new)
            return
        specs = field_specs(type(new))
        _, reload_names = changed(old, new, specs)

        def work() -> list[str]:
            return list(self.engine.apply_settings(new) or [])   # the budget reaches open conversations too

        def done(names: list[str]) -> None:
            self.settings = self.bridge.settings = new
            if names or reload_names:
                self.reload(new, old)
            else:
                self._save(new)
                self._applied(new)
            self.refresh_stats()
        self.bridge.call(work, on_done=done, on_error=self._settings_failed)

    def apply_window_setting(self, name: str, value: Any) -> bool:
        """A setting only the window reads (group Window: the text size, the theme) takes effect at once, even while
        a reply streams or a model loads: adopted, saved and announced (`settingsApplied`) with no engine call.
        False, with `settingsFailed`, when the value is refused."""
        if name not in {spec.name for spec in field_specs(type(self.settings)) if spec.group == "Window"}:
            raise ValueError(f"{name} is not a setting of the window alone")
        try:
            new = self.settings.replace(**{name: value})
        except ValueError as exc:
            self._settings_failed(f"Not applied: {exc}")
            return False
        self.settings = self.bridge.settings = new
        self._save(new)
        self.settingsApplied.emit(new)
        return True

    def reload(self, new: Any, old: Any) -> None:
        self._set_model_state("loading", "Reloading model…")

        def failed(exc: BaseException) -> None:
            self.settings = self.bridge.settings = old
            self.bridge.call(self.engine.apply_settings, old, on_error=self._fail)
            self._set_model_state("ready", model_name(self.model_info))
            self._settings_failed(f"The new model settings did not load ({error_text(exc)}); "
                                  f"still using {model_name(self.model_info)}.")

        def loaded(_: Any) -> None:
            self._save(new)
            self._applied(new)
            self.bridge.call(self.engine.model_info, on_done=self._model_ready, on_error=self._fail)
        self.bridge.call(self.engine.reload, new, on_error=failed,
                         on_done=lambda fut: self.bridge.track(fut, on_done=loaded, on_error=failed))

    # -- start-up checks -------------------------------------------------------------------
    def report_settings_file(self) -> None:
        """Say in the banner which values of the saved settings file were not used, why and where to change them
        (`Settings.load` kept their defaults and every other value)."""
        path = self.settings.config_dir / "settings.json"
        try:
            _, problems = type(self.settings).load_checked(path)
        except (OSError, ValueError) as exc:
            log.warning("checking %s: %s", path, exc)
            return
        self._settings_note("file", file_problems_text(problems, field_specs(type(self.settings))))

    def check_budget_floor(self, flag: bool = True) -> None:
        """Ask the engine for the smallest budget that works (new conversations and the open ones) and remember the
        prefix it was measured for (`budget_floor` uses it); with `flag`, a saved budget below it goes in the
        banner with the place to change it (new conversations would be refused)."""
        settings = self.settings

        def measured(smallest: int) -> None:
            self.__dict__["_floor_prefix_tokens"] = prefix_of_floor(smallest, settings)
            if not flag:
                return
            budget = self.settings.budget_tokens
            low = budget < smallest and recovery_backend(self.settings.recovery).evicts
            self._settings_note("budget", budget_floor_text(budget, smallest, field_specs(type(self.settings)))
                                if low else "")
        self.bridge.call(self.engine.min_budget_tokens, on_done=measured,
                         on_error=lambda exc: log.warning("smallest budget: %s", error_text(exc)))

    @property
    def budget_below_floor(self) -> bool:
        """The saved budget is below the smallest that works (flagged in the banner; a new conversation would be
        refused, so none is started for the user at start-up)."""
        return "budget" in self.__dict__.get("_settings_notes", {})

    def new_conversation_refusal(self) -> str:
        """Why New cannot create a conversation now ("" when it can): the saved budget is below the smallest that
        works (the engine would refuse it; the banner already names the value and where to change it)."""
        note = self.__dict__.get("_settings_notes", {}).get("budget", "")
        return f"A new conversation cannot start: {note}" if note else ""

    @property
    def floor_prefix_tokens(self) -> int | None:
        """The longest shared prefix the engine's smallest budget was last measured for (None: not yet)."""
        return self.__dict__.get("_floor_prefix_tokens")

    def measure_kv_disk(self, on_done: Any) -> None:
        """`on_done(bytes)`: what the saved KV files of every model take on disk now (the settings dialog shows it
        beside the cap); nothing when no model has loaded yet."""
        engine = self.engine
        if engine is None:
            return
        self.bridge.call(lambda: engine.kvfiles.total_bytes() if engine.kvfiles is not None else None,
                         on_done=lambda used: used is not None and on_done(used),
                         on_error=lambda exc: log.warning("measuring the KV files: %s", error_text(exc)))

    def _settings_note(self, key: str, text: str) -> None:
        """Show the start-up notes about the saved settings together in the banner (one per `key`)."""
        notes: dict[str, str] = self.__dict__.setdefault("_settings_notes", {})
        if not text and key not in notes:
            return
        notes.pop(key, None)
        if text:
            notes[key] = text
        if notes:
            self.raise_error("\n".join(notes.values()), "settings")
        else:
            self.errorResolved.emit("settings")

    def _settings_failed(self, error: BaseException | str) -> None:
        """Settings did not apply: `settingsFailed` (the window shows it in the settings dialog when it is
        open, else in the banner until settings apply)."""
        self.settingsFailed.emit(error if isinstance(error, str) else f"Not applied: {error_text(error)}")

    def _applied(self, settings: Any) -> None:
        self.__dict__.pop("_settings_notes", None)      # saved again: the file's problems are gone
        self.settingsApplied.emit(settings)
        self.errorResolved.emit("settings")
        if self.model_info is not None:
            self.check_budget_floor(flag=False)          # the prompt or tools may have changed the prefix

    def _save(self, settings: Any) -> None:
        try:
            settings.save()
        except OSError as exc:
            self.settingsFailed.emit(f"Settings could not be saved: {exc}")
