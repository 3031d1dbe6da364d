"""Where the runner's cost on a launch-bound loop comes from: runs a script (its own
per-iteration times say the cost) under one of four set-ups, each a layer of ``run``.

    python scripts/tools/diag_runner_cost.py MODE script.py [args...]

MODE:
- ``plain``: the script alone, through ``runpy`` as ``run`` starts it;
- ``events``: ``sys.monitoring``'s global events as the runner's engine sets them
  (PY_START, PY_RESUME, PY_THROW, PY_UNWIND), every code object switched off at its first
  call (``DISABLE``): what instrumenting the interpreter costs, with no code traced;
- ``engine``: the runner's engine (``runner.tracer``, ``sys.monitoring`` on 3.12+, else
  ``settrace``) tracing the script's own file into a sink that does nothing;
- ``run``: the whole runner (``python -m gpu_mem_track run``), for comparison.

Each prints the script's output as it comes. A diagnostic: it measures, and changes nothing.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODES = ("plain", "events", "engine", "run")


class NullSink:
    def enter(self, code: object) -> None:
        pass

    def line(self, code: object, lineno: int) -> None:
        pass

    def leave(self, code: object) -> None:
        pass


def _events_only() -> None:
    mon = sys.monitoring
    tool = 3 if mon.get_tool(3) is None else 4
    mon.use_tool_id(tool, "diag")
    events = mon.events

    def off(code: object, offset: int, *rest: object) -> object:
        return mon.DISABLE

    def none(code: object, offset: int, *rest: object) -> None:
        return None

    mon.register_callback(tool, events.PY_START, off)
    mon.register_callback(tool, events.PY_RESUME, off)
    mon.register_callback(tool, events.PY_THROW, none)
    mon.register_callback(tool, events.PY_UNWIND, none)
    mon.set_events(tool, events.PY_START | events.PY_RESUME | events.PY_THROW | events.PY_UNWIND)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in MODES:
        print(f"usage: diag_runner_cost.py {{{','.join(MODES)}}} script.py [args...]", file=sys.stderr)
        return 2
    mode, script, args = argv[0], str(Path(argv[1]).resolve()), argv[2:]
    if mode == "run":
        os.execv(sys.executable, [sys.executable, "-m", "gpu_mem_track", "run", script, *args])
    if mode == "events":
        if not hasattr(sys, "monitoring"):
            print("diag: no sys.monitoring on this Python", file=sys.stderr)
            return 2
        _events_only()
    elif mode == "engine":
        from gpu_mem_track.runner.tracer import engine_class

        engine_class()(NullSink(), lambda code: code.co_filename == script).start()
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).parent)
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
