#!/usr/bin/env bash
# Installs a launcher so Evoke Desk starts by double-click (Linux, freedesktop menus and desktop).
#   bash packaging/install-desktop.sh              # runs the installed venv: .venv/bin/evoke-desk
#   bash packaging/install-desktop.sh --bundle     # runs the PyInstaller bundle in dist/evoke-desk/
#   bash packaging/install-desktop.sh --bundle dist/cuda/evoke-desk    # another bundle folder (the CUDA one)
#   bash packaging/install-desktop.sh --uninstall
# Writes only under ~/.local/share (and ~/Desktop when it exists); no root needed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
APPS=$DATA/applications
ICONS=$DATA/icons/hicolor
DESKTOP_DIR=$(xdg-user-dir DESKTOP 2>/dev/null || echo "$HOME/Desktop")
NAME=evoke-desk

if [ "${1:-}" = "--uninstall" ]; then
  rm -f "$APPS/$NAME.desktop" "$DESKTOP_DIR/$NAME.desktop" "$ICONS/scalable/apps/$NAME.svg"
  for size in 48 64 128 256; do rm -f "$ICONS/${size}x${size}/apps/$NAME.png"; done
  command -v update-desktop-database >/dev/null && update-desktop-database -q "$APPS" || true
  echo "uninstalled $NAME launcher"
  exit 0
fi

if [ "${1:-}" = "--bundle" ]; then
  EXEC="$(realpath -m "${2:-$ROOT/dist/$NAME}")/$NAME"
  [ -x "$EXEC" ] || { echo "no bundle at $EXEC: build it with make bundle (packaging/build_bundle.sh)" >&2; exit 1; }
else
  EXEC="$ROOT/.venv/bin/$NAME"
  if [ ! -x "$EXEC" ]; then
    [ -x "$ROOT/.venv/bin/python" ] || { echo "no .venv: run 'make install' first" >&2; exit 1; }
    EXEC="$ROOT/.venv/bin/python -m app"      # editable install without the gui script
  fi
fi

mkdir -p "$APPS" "$ICONS/scalable/apps"
cp "$ROOT/resources/icons/$NAME.svg" "$ICONS/scalable/apps/$NAME.svg"
# PNG sizes for menus that ignore SVG, rendered with the Qt already installed for the app.
PY="$ROOT/.venv/bin/python"
if [ -x "$PY" ]; then
  QT_QPA_PLATFORM=offscreen "$PY" - "$ROOT/resources/icons/$NAME.svg" "$ICONS" "$NAME" <<'PYEOF' || true
import sys
from pathlib import Path
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer
app = QGuiApplication([])
svg, root, name = QSvgRenderer(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
for size in (48, 64, 128, 256):
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(0)
    painter = QPainter(image)
    svg.render(painter)
    painter.end()
    out = root / f"{size}x{size}" / "apps"
    out.mkdir(parents=True, exist_ok=True)
    image.save(str(out / f"{name}.png"))
PYEOF
fi

sed -e "s|^Exec=.*|Exec=$EXEC|" -e "s|^Icon=.*|Icon=$NAME|" "$ROOT/packaging/$NAME.desktop" > "$APPS/$NAME.desktop"
echo "Path=$ROOT" >> "$APPS/$NAME.desktop"          # `python -m app` needs the repository as working dir
chmod 755 "$APPS/$NAME.desktop"
if [ -d "$DESKTOP_DIR" ]; then
  cp "$APPS/$NAME.desktop" "$DESKTOP_DIR/$NAME.desktop"
  chmod 755 "$DESKTOP_DIR/$NAME.desktop"
  command -v gio >/dev/null && gio set "$DESKTOP_DIR/$NAME.desktop" metadata::trusted true 2>/dev/null || true
fi
command -v update-desktop-database >/dev/null && update-desktop-database -q "$APPS" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$ICONS" 2>/dev/null || true
command -v desktop-file-validate >/dev/null && desktop-file-validate "$APPS/$NAME.desktop" || true
echo "installed $APPS/$NAME.desktop (Exec=$EXEC)"
