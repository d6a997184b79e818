"""`python -m app` / `evoke-desk`: start the window on the saved settings (embedded model by default);
`evoke-desk serve|chat|device|rpc-worker|aider-metadata|models|pull` run the engine's command line instead,
`--version` says the version, `--help` names the data folder, the settings and the log file.

Invariants: one window per data folder (a second start brings the first to the front and exits 0; read-only only
when the first does not answer); SIGTERM, SIGINT, SIGHUP and a desktop logout close the window cleanly: the engine
closes (KV files written) and the exit status is 0 (`shutdown.py`); records go to stderr and the rotating log file.

Also the documentation shots: --screenshot, --memory-screenshot, --settings-screenshot, --actions-screenshot write a
PNG after a scripted demo and quit (they use a throw-away EVOKE_HOME unless one is set).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

# `evoke-desk <command>`: the engine's command line
ENGINE_COMMANDS = ("serve", "chat", "device", "rpc-worker", "aider-metadata", "models", "pull")


def help_epilog() -> str:
    """Where the window keeps its files (the folder is the one the window uses: $EVOKE_HOME or the platform's)."""
    from evoke_engine import Settings
    from evoke_engine.logs import log_file

    settings = Settings()
    lab = ("lab benches:     evoke-desk bench NAME ... (the bundle's measurements, as python -m benchmarks NAME; "
           "see evoke-desk bench --help)\n") if getattr(sys, "frozen", False) else ""
    return (f"engine commands: evoke-desk {{{','.join(ENGINE_COMMANDS)}}} ... (see evoke-desk serve --help)\n"
            f"{lab}"
            f"data folder:     {settings.data_dir}  (chat history, KV files; private, set EVOKE_HOME to move it)\n"
            f"settings file:   {settings.config_dir / 'settings.json'}\n"
            f"log file:        {log_file()}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from evoke_engine.logs import version_line

    parser = argparse.ArgumentParser(prog="evoke-desk", description="Evoke Desk: local coding chat.\nAlso "
                                     f"`evoke-desk {'|'.join(ENGINE_COMMANDS)}` (see `evoke-desk serve --help`).",
                                     epilog=help_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_line("evoke-desk"))
    parser.add_argument("--model", help="GGUF model file (default: the saved setting or the embedded model)")
    parser.add_argument("--budget", type=int, help="active-KV budget in tokens for this run")
    parser.add_argument("--screenshot", metavar="FILE", help="save the main window after a demo exchange")
    parser.add_argument("--memory-screenshot", metavar="FILE", help="save the memory panel after evictions")
    parser.add_argument("--settings-screenshot", metavar="FILE", help="save the settings dialog")
    parser.add_argument("--actions-screenshot", metavar="FILE", help="save the window with a reply's hover actions")
    parser.add_argument("--settings-tab", default="Memory", help="tab shown by --settings-screenshot")
    parser.add_argument("--size", default="1440x900", help="window size WxH (screenshots)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def dark_palette() -> QPalette:
    pal = QPalette()
    for role, color in ((QPalette.ColorRole.Window, "#0d1117"), (QPalette.ColorRole.WindowText, "#e6edf3"),
                        (QPalette.ColorRole.Base, "#0d1117"), (QPalette.ColorRole.AlternateBase, "#11161d"),
                        (QPalette.ColorRole.Text, "#e6edf3"), (QPalette.ColorRole.Button, "#21262d"),
                        (QPalette.ColorRole.ButtonText, "#e6edf3"), (QPalette.ColorRole.Highlight, "#2d4a7a"),
                        (QPalette.ColorRole.HighlightedText, "#ffffff"), (QPalette.ColorRole.Link, "#7aa2f7"),
                        (QPalette.ColorRole.ToolTipBase, "#161b22"), (QPalette.ColorRole.ToolTipText, "#e6edf3"),
                        (QPalette.ColorRole.PlaceholderText, "#6e7681")):
        pal.setColor(role, QColor(color))
    return pal


def make_application(argv: list[str] | None = None) -> QApplication:
    from .resources import icon, stylesheet
    app = QApplication.instance() or QApplication(argv or [sys.argv[0]])
    app.setApplicationName("Evoke Desk")
    app.setOrganizationName("evoke-desk")
    app.setDesktopFileName("evoke-desk")
    app.setStyle("Fusion")
    app.setPalette(dark_palette())
    app.setStyleSheet(stylesheet())
    app.setWindowIcon(icon("evoke-desk"))
    return app


def build(settings, size: tuple[int, int] | None = None):
    """(bridge, controller, window) for `settings`; the caller starts the controller."""
    from .bridge import EngineBridge
    from .controller import ChatController
    from .window import MainWindow
    bridge = EngineBridge(settings)
    controller = ChatController(bridge)
    window = MainWindow(controller)
    if size:
        window.resize(*size)
    return bridge, controller, window


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv[:1] and argv[0] in ENGINE_COMMANDS:    # the endpoint, the terminal chat, ... without the window
        from evoke_engine.__main__ import main as engine_main

        return engine_main(argv, prog="evoke-desk")
    args = parse_args(argv)
    shooting = args.screenshot or args.memory_screenshot or args.settings_screenshot or args.actions_screenshot
    if shooting and not os.environ.get("EVOKE_HOME"):
        os.environ["EVOKE_HOME"] = tempfile.mkdtemp(prefix="evoke-desk-shot-")
    from evoke_engine.logs import configure_logging

    configure_logging(logging.DEBUG if args.verbose else logging.INFO,
                      file_level=logging.DEBUG if args.verbose else logging.INFO)
    app = make_application(["evoke-desk"])          # argv[0] names the X11 WM class (StartupWMClass)
    from evoke_engine import Settings
    overrides: dict = {}
    if args.model:
        overrides["model_path"] = args.model
    if args.budget:
        overrides["budget_tokens"] = args.budget
    if args.memory_screenshot:
        overrides.update(budget_tokens=args.budget or 640, block_tokens=64)
    settings = Settings.load()
    if overrides:
        settings = settings.replace(**overrides)
    from .single_instance import InstanceServer, activate_running

    if not shooting and activate_running(settings.data_dir):
        print("Evoke Desk is already open on this data folder: brought its window to the front", flush=True)
        return 0
    width, height = (int(x) for x in args.size.lower().split("x"))
    bridge, controller, window = build(settings, (width, height))
    instance = None if shooting else InstanceServer(settings.data_dir, window)
    from .system_quit import ShutdownHandler

    shutdown = ShutdownHandler(app, window, lambda: bridge.engine)
    window.show()
    if args.settings_screenshot:
        from .demo import settings_screenshot
        settings_screenshot(window, args.settings_screenshot, args.settings_tab)
    else:
        controller.start()
    if args.screenshot or args.memory_screenshot or args.actions_screenshot:
        from .demo import ACTIONS_DEMO, MAIN_DEMO, MEMORY_DEMO, DemoDirector
        if args.actions_screenshot:
            DemoDirector(window, ACTIONS_DEMO, args.actions_screenshot, target="actions")
        elif args.memory_screenshot:
            window.memory_dock.setFloating(False)
            DemoDirector(window, MEMORY_DEMO, args.memory_screenshot, target="memory")
        else:
            DemoDirector(window, MAIN_DEMO, args.screenshot)
    window.closed.connect(app.quit)
    app.setQuitOnLastWindowClosed(True)
    code = app.exec()
    if instance is not None:
        instance.server.close()                  # a start from now on opens its own window
    window.hide()
    bridge.close()
    shutdown.restore()
    return code


if __name__ == "__main__":
    sys.exit(main())
