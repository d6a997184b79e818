#!/usr/bin/env bash
# Checks that the system libraries a real window needs are present: Qt's xcb platform plugin (X11) links
# libxcb-cursor, -icccm, -keysyms, ... that bare Debian/Ubuntu images lack (Qt's error names only the first).
# Asks the dynamic linker (ldd) about the plugin that PySide6 installed, so the list is the plugin's own.
# Warns and names the Debian/Ubuntu packages to install; never fails (CI and servers run headless:
# QT_QPA_PLATFORM=offscreen needs none of these). Usage: bash packaging/check-system-libs.sh [PYTHON]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-.venv/bin/python}}
QT=$("$PY" -c 'import os, PySide6; print(os.path.join(os.path.dirname(PySide6.__file__), "Qt"))' 2>/dev/null) || {
  echo "check-system-libs: PySide6 is not installed for $PY; skipped"; exit 0; }
command -v ldd >/dev/null 2>&1 || { echo "check-system-libs: no ldd on this system; skipped"; exit 0; }

# soname -> Debian/Ubuntu package
declare -A PACKAGE=(
  [libxcb-cursor.so.0]=libxcb-cursor0 [libxcb-icccm.so.4]=libxcb-icccm4 [libxcb-keysyms.so.1]=libxcb-keysyms1
  [libxcb-image.so.0]=libxcb-image0 [libxcb-render-util.so.0]=libxcb-render-util0 [libxcb-util.so.1]=libxcb-util1
  [libxcb-randr.so.0]=libxcb-randr0 [libxcb-shape.so.0]=libxcb-shape0 [libxcb-xkb.so.1]=libxcb-xkb1
  [libxcb-sync.so.1]=libxcb-sync1 [libxcb-xfixes.so.0]=libxcb-xfixes0 [libxcb-shm.so.0]=libxcb-shm0
  [libxcb-render.so.0]=libxcb-render0 [libxcb.so.1]=libxcb1 [libX11-xcb.so.1]=libx11-xcb1 [libX11.so.6]=libx11-6
  [libxkbcommon.so.0]=libxkbcommon0 [libxkbcommon-x11.so.0]=libxkbcommon-x11-0 [libEGL.so.1]=libegl1
  [libGL.so.1]=libgl1 [libfontconfig.so.1]=libfontconfig1 [libfreetype.so.6]=libfreetype6
  [libdbus-1.so.3]=libdbus-1-3 [libglib-2.0.so.0]=libglib2.0-0
)
missing=$(ldd "$QT/plugins/platforms/libqxcb.so" "$QT/lib/libQt6XcbQpa.so.6" 2>/dev/null \
  | awk '/not found/ {print $1}' | sort -u)
if [ -z "$missing" ]; then
  echo "check-system-libs: the libraries of Qt's X11 (xcb) plugin are all present"
  exit 0
fi
packages=""
for soname in $missing; do packages="$packages ${PACKAGE[$soname]:-"(the package holding $soname)"}"; done
echo "warning: the window needs system libraries this machine lacks:$(printf ' %s' $missing)" >&2
echo "  on Debian/Ubuntu: sudo apt-get install$packages" >&2
echo "  (headless use is unaffected: \`serve\`, \`chat\` and QT_QPA_PLATFORM=offscreen need none of them)" >&2
exit 0
