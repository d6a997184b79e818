"""PyInstaller entry point: the bundled executable runs `app.__main__.main()` (the package's own
relative imports need a package context, which a script entry does not have).

`evoke-desk bench NAME ...` runs the lab's command line instead (`python -m benchmarks NAME ...`, the same
`benchmarks.__main__.main`), so the bundle's figures come from the code a checkout measures with
(packaging/bundle_restore.py sets the two side by side); the window's normal start never imports the lab.
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["bench"]:
        from benchmarks.__main__ import main as bench_main

        try:
            sys.exit(bench_main(sys.argv[2:]))
        except ModuleNotFoundError as missing:      # a bench whose own dependency (httpx, openai, gguf) is left out
            sys.exit(f"evoke-desk bench: this bench needs {missing.name}, which the bundle does not carry; run it "
                     "from a checkout: python -m benchmarks " + " ".join(sys.argv[2:3]))
    from app.__main__ import main

    sys.exit(main())
