"""Run a script plainly and write the allocator's figures as JSON after it (for gpu_check.py).

    python scripts/gpu/gpu_check_wrap.py OUT.json SNAPSHOT|- SCRIPT [ARGS...]

Runs SCRIPT as ``python SCRIPT ARGS`` would (``sys.argv``, ``sys.path[0]``, run as
``__main__``; the caller picks the working directory). With a SNAPSHOT path (not ``-``)
and CUDA available it first arms ``torch.cuda.memory._record_memory_history`` (Python
stacks) and dumps the snapshot there after the script. Whatever way the script ends, it
then writes OUT.json: ``exit_code``, ``seconds`` (the script's wall time), and when CUDA
was used ``max_memory_allocated``, ``max_memory_reserved`` (bytes, device 0),
``num_alloc_retries``, ``num_ooms``, ``device_name``, ``torch``. The exit code is the
script's. Nothing of gpu_mem_track is imported: this is the plain run the others are
compared with.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback


def _figures() -> dict:
    import torch

    out: dict = {"torch": torch.__version__, "cuda": False}
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return out
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats(0)
    out.update(
        cuda=True,
        device_name=torch.cuda.get_device_name(0),
        max_memory_allocated=torch.cuda.max_memory_allocated(0),
        max_memory_reserved=torch.cuda.max_memory_reserved(0),
        num_alloc_retries=stats.get("num_alloc_retries", 0),
        num_ooms=stats.get("num_ooms", 0),
    )
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out_path, snapshot, script, args = argv[0], argv[1], argv[2], argv[3:]
    import torch

    recording = snapshot != "-" and torch.cuda.is_available()
    if recording:
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    started = time.perf_counter()
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the script's own failure: print it as Python would, keep going
        traceback.print_exc()
        code = 1
    seconds = time.perf_counter() - started
    result = {"exit_code": code, "seconds": round(seconds, 3), **_figures()}
    if recording and result["cuda"]:
        torch.cuda.memory._dump_snapshot(snapshot)
        result["snapshot"] = snapshot
    if recording:
        torch.cuda.memory._record_memory_history(enabled=None)
    with open(out_path, "w") as stream:
        json.dump(result, stream, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
