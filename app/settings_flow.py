"""Applying settings from the dialog: what applies now goes to the engine at once, the rest reloads.

Invariants: a reload that fails leaves the previous model and settings in place (and says so);
settings reach disk only once they took effect; settings are frozen values the window and the engine share; every
outcome is signalled: `settingsApplied` (then `errorResolved("settings")`) or `settingsFailed` with a readable reason.
"""

from __future__ import annotations

from typing import Any

from .bridge import error_text
from .messages import model_name
from .settings_form import changed, field_specs


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

    def _settings_failed(self, error: BaseException | str) -> None:
        """Settings did not apply: `settingsFailed` (the window shows it in the settings dialog when it is
        open, else in the banner until settings apply)."""
        self.settingsFailed.emit(error if isinstance(error, str) else f"Not applied: {error_text(error)}")

    def _applied(self, settings: Any) -> None:
        self.settingsApplied.emit(settings)
        self.errorResolved.emit("settings")

    def _save(self, settings: Any) -> None:
        try:
            settings.save()
        except OSError as exc:
            self.settingsFailed.emit(f"Settings could not be saved: {exc}")
