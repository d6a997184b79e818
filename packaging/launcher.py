"""PyInstaller entry point: the bundled executable runs `app.__main__.main()` (the package's own
relative imports need a package context, which a script entry does not have)."""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
