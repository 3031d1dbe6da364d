"""Wall time and CPU time of one ``gpu-mem-track fit`` (its whole process tree).

The machine this project is measured on is shared, so a wall time depends on what else
runs; the CPU time of fit's process tree much less. Runs ``python -m gpu_mem_track ARGS``
in a session of its own (``PYTHONPATH`` as given: a checkout to measure) in the current
folder, and reads /proc every 0.2 s: fit's own user+system time plus its fork server's
user+system time and that of its children it reaped (every trial: ``cutime``/``cstime``
of /proc/PID/stat), the latest reading of each. Linux only. Prints one JSON line:
``{"wall_s", "cpu_s", "exit_code", "load_before", "load_after"}``.

    python scripts/bench/fit_cpu.py --pythonpath CHECKOUT -- fit --batch-arg 0 12GiB:sm90 train.py 16 1024
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()  # state, ppid, pgrp, session, ..., utime at 11


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and int(fields[1]) == pid:
                out.append(int(entry))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythonpath", required=True, help="the checkout whose gpu_mem_track runs")
    parser.add_argument("--stdout", default=os.devnull, help="where fit's standard output goes (its answer)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="gpu_mem_track's arguments, after --")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    env = {**os.environ, "PYTHONPATH": options.pythonpath}
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    answer = open(options.stdout, "wb")  # noqa: SIM115 - closed after fit ends
    fit = subprocess.Popen(
        [sys.executable, "-m", "gpu_mem_track", *args],
        env=env,
        start_new_session=True,
        stdout=answer,
        stderr=subprocess.DEVNULL,
    )
    own = server = 0
    server_pid = None
    while fit.poll() is None:
        fields = _stat(fit.pid)
        if fields:
            own = max(own, int(fields[11]) + int(fields[12]))
        if server_pid is None:
            server_pid = next((c for c in _children(fit.pid) if "forkserver" in _cmdline(c)), None)
        if server_pid is not None:
            fields = _stat(server_pid)
            if fields:
                server = max(server, sum(int(v) for v in fields[11:15]))
        time.sleep(0.2)
    wall = time.monotonic() - started
    answer.close()
    print(
        json.dumps(
            {
                "wall_s": round(wall, 1),
                "cpu_s": round((own + server) / TICK, 1),
                "exit_code": fit.returncode,
                "load_before": round(load_before, 1),
                "load_after": round(os.getloadavg()[0], 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
