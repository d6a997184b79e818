"""The settings dialog, built generically from `Settings.describe()` (via `settings_form`).

Invariant: one editor per declared setting, showing its default, range and when it applies;
`applied` carries a validated Settings, never a half-valid one (errors stay in the dialog). With
`wait_for_result`, OK keeps the dialog open until the owner calls `result_applied` (it closes) or
`result_failed` (the reason shows here, above the buttons, and nothing is lost).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from .. import settings_form as form
from ..model_finder import find_models
from ..resources import resources_dir
from .status_bar import device_details

INT_MAX = 2**31 - 1


class ModelPicker(QWidget):
    """The embedded model, GGUF files found in the usual places, and Browse…"""

    def __init__(self, current: str | None, models_dir, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.combo = QComboBox(objectName="modelCombo")
        self.combo.setMinimumWidth(360)
        for model in find_models(models_dir):
            self.combo.addItem(model.label if model.path is None else f"{model.label} — {model.source}",
                               model.path)
            if model.path:
                self.combo.setItemData(self.combo.count() - 1, model.path, Qt.ItemDataRole.ToolTipRole)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row.addWidget(self.combo, 1)
        row.addWidget(browse)
        self.set_path(current)

    def set_path(self, path: str | None) -> None:
        index = self.combo.findData(path)
        if index < 0:
            self.combo.addItem(f"{path}", path)
            index = self.combo.count() - 1
        self.combo.setCurrentIndex(index)

    def path(self) -> str | None:
        return self.combo.currentData()

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.set_path(path)


class SettingsDialog(QDialog):
    applied = Signal(object)          # a validated Settings

    def __init__(self, settings: Any, parent: QWidget | None = None, model_info: Any = None,
                 min_budget: Callable[[Any], int] | None = None, prefix_tokens: int | None = None) -> None:
        super().__init__(parent)
        self.min_budget = min_budget              # settings -> the smallest active-KV budget that works
        self.kv_disk_bytes: int | None = None     # what the saved KV files take now (`show_disk_use`)
        self.prefix_tokens = prefix_tokens
        self.wait_for_result = False              # OK waits for result_applied / result_failed
        self.closing = False
        self.setWindowTitle("Settings — Evoke Desk")
        self.setObjectName("settingsDialog")
        self.resize(860, 740)
        self.base = settings
        self.specs = form.field_specs(type(settings))
        self.editors: dict[str, QWidget] = {}
        self.hints: dict[str, QLabel] = {}
        layout = QVBoxLayout(self)
        note = QLabel("Settings marked <span style='color:#3fb950'>applies now</span> take effect at once "
                      "(a lower budget evicts the open conversation down to it); those marked "
                      "<span style='color:#d29922'>after model reload</span> reload the model when you press "
                      "OK or Apply. Saved under " + str(settings.config_dir) + ".", objectName="settingsNote")
        note.setWordWrap(True)
        layout.addWidget(note)
        self.tabs = QTabWidget(objectName="settingsTabs")
        for group, specs in form.grouped(self.specs).items():
            device = model_info if group == "Model" else None
            self.tabs.addTab(self._page(specs, device), form.GROUP_TITLES.get(group, group).replace("&", "&&"))
        layout.addWidget(self.tabs, 1)
        self.recompute = QLabel(objectName="settingsRecompute")     # what the pending change recomputes
        self.recompute.setWordWrap(True)
        self.recompute.hide()
        layout.addWidget(self.recompute)
        self.error = QLabel(objectName="settingsError")
        self.error.setWordWrap(True)
        self.error.hide()
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Apply
                                   | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.Apply).clicked.connect(self.apply)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(self.restore_defaults)
        self.buttons = buttons
        layout.addWidget(buttons)
        for spec in self.specs:
            self.set_value(spec.name, getattr(settings, spec.name))
        for name in form.SAVED_STATE_EFFECTS:
            self._on_change(self.editors.get(name), self.update_recompute)
        for name in ("block_tokens", "tail_fraction"):        # the smallest budget follows them
            self._on_change(self.editors.get(name), self._update_budget_hint)
        for name in ("budget_tokens", "block_tokens", "tail_fraction"):
            self._on_change(self.editors.get(name), self.check_budget)

    def check_budget(self, *_: Any) -> str:
        """Say at once, under the tabs, why the typed budget cannot work (the same rule as Apply and as the
        settings file at start-up: the declared range, then the smallest budget that holds the shared prefix and a
        reply); the message goes when the budget works. Returns the problem ("" when none)."""
        spec = self.spec("budget_tokens")
        try:
            budget = self.value("budget_tokens")
            problem = self.budget_problem(self._pending_floor_settings(), budget) or spec.check(budget)
        except (ValueError, TypeError):
            return ""
        if problem:
            self.show_error(f"Not applied: {problem}")
            self._budget_error = True
        elif getattr(self, "_budget_error", False):
            self._budget_error = False
            self.error.hide()
        return problem

    # -- building ---------------------------------------------------------------------------
    def _page(self, specs: list[form.FieldSpec], model_info: Any = None) -> QWidget:
        page = QWidget()
        fl = QFormLayout(page)
        fl.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        fl.setVerticalSpacing(4)
        fl.setHorizontalSpacing(14)
        if model_info is not None:           # what the loaded model runs on, above its settings
            self.device_info = QLabel(device_details(model_info), objectName="settingsDevice")
            self.device_info.setWordWrap(True)
            fl.addRow(QLabel("Loaded on:"), self.device_info)
        for spec in specs:
            editor = self._editor(spec)
            self.editors[spec.name] = editor
            hint = QLabel(objectName="settingHint")
            hint.setWordWrap(True)
            self.hints[spec.name] = hint
            cell = QWidget()
            col = QVBoxLayout(cell)
            col.setContentsMargins(0, 4, 0, 6)
            col.setSpacing(2)
            col.addWidget(editor)
            col.addWidget(hint)
            label = QLabel(spec.label + ":")
            label.setToolTip(spec.description)
            editor.setToolTip(spec.description)
            fl.addRow(label, cell)
            self._update_hint(spec)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(page)
        return scroll

    def _editor(self, spec: form.FieldSpec) -> QWidget:
        if spec.kind == "model":
            return ModelPicker(None, self.base.data_dir / "models")
        if spec.kind == "prompt":
            edit = QPlainTextEdit(objectName="promptEditor")
            edit.setMinimumHeight(260)
            default = resources_dir() / "system_prompt.txt"
            edit.setPlaceholderText("Empty: the built-in prompt:\n\n" + (
                default.read_text(encoding="utf-8") if default.exists() else ""))
            return edit
        if spec.kind == "choice":
            combo = QComboBox()
            combo.addItems([str(choice) for choice in spec.choices or ()])
            combo.setMaximumWidth(260)
            return combo
        if spec.kind == "bool":
            return QCheckBox()
        if spec.kind == "int":
            box = QSpinBox()
            low = 1 if spec.name == "budget_tokens" else spec.low    # a budget too small is typed, then refused
            box.setRange(int(max(low or 0, -INT_MAX)), int(min(spec.high or INT_MAX, INT_MAX)))   # with the reason
            if spec.unit:
                box.setSuffix(" " + spec.unit)
            box.setMaximumWidth(200)
            return box
        if spec.kind in ("float", "bytes"):
            box = QDoubleSpinBox()
            if spec.kind == "bytes":
                box.setDecimals(0)
                box.setRange((spec.low or 0) / form.MIB, (spec.high or 0) / form.MIB)
                box.setSuffix(" MiB")
                box.setSingleStep(256)
            else:
                box.setDecimals(3)
                box.setRange(spec.low if spec.low is not None else -1e9, spec.high if spec.high is not None else 1e9)
                box.setSingleStep(0.05)
            box.setMaximumWidth(200)
            return box
        return QLineEdit()

    @staticmethod
    def _on_change(editor: QWidget | None, slot) -> None:
        signal = {QComboBox: "currentTextChanged", QSpinBox: "valueChanged", QDoubleSpinBox: "valueChanged",
                  QLineEdit: "textChanged", QCheckBox: "toggled"}.get(type(editor))
        if signal is not None:
            getattr(editor, signal).connect(slot)
        elif isinstance(editor, ModelPicker):
            editor.combo.currentIndexChanged.connect(slot)

    def update_recompute(self, *_: Any) -> None:
        """Say, before OK or Apply, what the pending change recomputes in saved conversations."""
        values = {}
        for name in form.SAVED_STATE_EFFECTS:
            try:
                values[name] = self.value(name)
            except (ValueError, TypeError):
                continue
        notes = form.recompute_notes(self.base, values, self.specs)
        self.recompute.setText("When applied: " + "; ".join(notes) if notes else "")
        self.recompute.setVisible(bool(notes))

    def budget_range_text(self, settings: Any) -> str:
        """The budget's range with its real minimum under `settings` (the shared prefix and room for a reply),
        not the declared 64."""
        spec = self.spec("budget_tokens")
        high = form.human_count(spec.high)
        if self.min_budget is None:
            return (f"at least the shared prefix and room for a reply (the smallest shows here once a conversation "
                    f"is open), at most {high} tokens")
        held = f"the shared prefix of {self.prefix_tokens} tokens" if self.prefix_tokens else "the shared prefix"
        return f"{self.min_budget(settings)} to {high} tokens (the smallest holds {held} and a reply)"

    def _pending_floor_settings(self) -> Any:
        """The base settings with the edited values the smallest budget depends on (block size, tail)."""
        changes = {}
        for name in ("block_tokens", "tail_fraction"):
            if name in self.editors:
                changes[name] = self.value(name)
        return dataclasses.replace(self.base, **changes)

    def _update_budget_hint(self, *_: Any) -> None:
        try:
            settings = self._pending_floor_settings()
        except (ValueError, TypeError):
            return
        self._update_hint(self.spec("budget_tokens"), settings)

    def _update_hint(self, spec: form.FieldSpec, settings: Any = None) -> None:
        parts = [spec.default_text]
        if spec.name == "budget_tokens":
            parts.append(self.budget_range_text(settings or self.base))
        elif spec.range_text():
            parts.append(spec.range_text())
        now = spec.applies == form.NOW
        parts.append(f"<span style='color:{'#3fb950' if now else '#d29922'}'>{spec.applies_text}</span>")
        if spec.name == "disk_budget_bytes" and self.kv_disk_bytes is not None:
            parts.append(f"<b>in use now: {form.human_bytes(self.kv_disk_bytes)} of "
                         f"{form.human_bytes(self.base.disk_budget_bytes)}</b>")
        effect = form.SAVED_STATE_EFFECTS.get(spec.name)
        self.hints[spec.name].setText(" · ".join(parts) + f"<br><span style='color:#7d8590'>"
                                      f"{spec.description}{' Changing it: ' + effect + '.' if effect else ''}"
                                      "</span>")

    def show_disk_use(self, used_bytes: int) -> None:
        """Show beside the KV disk cap what the saved KV files take now."""
        self.kv_disk_bytes = used_bytes
        self._update_hint(self.spec("disk_budget_bytes"))

    # -- values -----------------------------------------------------------------------------
    def spec(self, name: str) -> form.FieldSpec:
        return next(s for s in self.specs if s.name == name)

    def set_value(self, name: str, value: Any) -> None:
        spec, editor = self.spec(name), self.editors[name]
        shown = form.to_editor(spec, value)
        if isinstance(editor, ModelPicker):
            editor.set_path(value)
        elif isinstance(editor, QPlainTextEdit):
            editor.setPlainText(shown or "")
        elif isinstance(editor, QComboBox):
            editor.setCurrentText(str(shown))
        elif isinstance(editor, QCheckBox):
            editor.setChecked(bool(shown))
        elif isinstance(editor, QSpinBox | QDoubleSpinBox):
            editor.setValue(shown)
        elif isinstance(editor, QLineEdit):
            editor.setText("" if shown is None else str(shown))

    def value(self, name: str) -> Any:
        spec, editor = self.spec(name), self.editors[name]
        if isinstance(editor, ModelPicker):
            shown: Any = editor.path()
        elif isinstance(editor, QPlainTextEdit):
            shown = editor.toPlainText()
        elif isinstance(editor, QComboBox):
            shown = editor.currentText()
        elif isinstance(editor, QCheckBox):
            shown = editor.isChecked()
        elif isinstance(editor, QSpinBox | QDoubleSpinBox):
            shown = editor.value()
        else:
            shown = editor.text()
        return form.from_editor(spec, shown)

    def values(self) -> dict[str, Any]:
        return {spec.name: self.value(spec.name) for spec in self.specs}

    def result_settings(self) -> Any:
        """The settings the editors describe; ValueError with a readable message when invalid."""
        return form.build(self.base, self.values(), self.specs)

    def restore_defaults(self) -> None:
        for spec in self.specs:
            self.set_value(spec.name, spec.default)

    def budget_problem(self, settings: Any, budget: int | None = None) -> str:
        """Why the budget of `settings` (or `budget` under `settings`) cannot work ("" when it can): it must hold
        the shared prefix and leave room for a reply."""
        budget = settings.budget_tokens if budget is None else budget
        smallest = self.min_budget(settings) if self.min_budget is not None else 0
        if budget >= smallest:
            return ""
        held = f"the shared prefix ({self.prefix_tokens} tokens: system prompt and tools)" \
            if self.prefix_tokens else "the shared prefix"
        return (f"an active-KV budget of {budget} tokens is too small: it must hold {held} and "
                f"leave room for a reply. The smallest budget that works is {smallest} tokens.")

    def _tab_of(self, name: str) -> int:
        editor = self.editors[name]
        for index in range(self.tabs.count()):
            if self.tabs.widget(index).isAncestorOf(editor):
                return index
        return self.tabs.currentIndex()

    def show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()

    def apply(self) -> bool:
        if self.check_budget():                     # shown under the tabs; the budget's tab comes forward
            self.tabs.setCurrentIndex(self._tab_of("budget_tokens"))
            self.editors["budget_tokens"].setFocus()
            return False
        try:
            new = self.result_settings()
            problem = self.budget_problem(new)
        except (ValueError, TypeError) as exc:
            self.show_error(f"Not applied: {exc}")
            return False
        if problem:
            self.show_error(f"Not applied: {problem}")
            self.tabs.setCurrentIndex(self._tab_of("budget_tokens"))
            self.editors["budget_tokens"].setFocus()
            return False
        self.error.hide()
        self.base = new
        self.update_recompute()
        self.applied.emit(new)
        return True

    def accept(self) -> None:
        if self.apply():
            if self.wait_for_result:
                self.closing = True                # result_applied closes, result_failed keeps it open
                self.buttons.setEnabled(False)
            else:
                super().accept()

    def result_applied(self) -> None:
        """The owner applied the settings: close if OK asked to."""
        self.buttons.setEnabled(True)
        if self.closing:
            self.closing = False
            super().accept()

    def result_failed(self, text: str) -> None:
        """The owner could not apply them: say why here and stay open with the values as typed."""
        self.closing = False
        self.buttons.setEnabled(True)
        self.show_error(text)
