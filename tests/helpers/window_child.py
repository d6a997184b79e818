"""Child process for the window's shutdown tests: the real `python -m app` entry (`app.__main__.main`) on the
embedded model, with one message typed for it once the window exists. Prints `STREAMING <id>` at the reply's first
piece and `REPLIED <id>` when it is done, so the test knows when to send its signal."""

from __future__ import annotations

import sys

import app.__main__ as entry

real_build = entry.build


def build(settings, size=None):
    bridge, controller, window = real_build(settings, size)
    said: set[str] = set()

    def say(what: str) -> None:
        if what not in said:
            said.add(what)
            print(f"{what} {controller.current_id}", flush=True)

    controller.replyProgress.connect(lambda _text: say("STREAMING"))
    controller.replyFinished.connect(lambda _message: say("REPLIED"))
    controller.send(sys.argv[1], max_tokens=int(sys.argv[2]), temperature=0.0)   # waits for the model
    return bridge, controller, window


entry.build = build

if __name__ == "__main__":
    sys.exit(entry.main(["--size", "900x600"]))
