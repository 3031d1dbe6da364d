"""``gpu-mem-track fit`` interrupted (SIGTERM, Ctrl-C's SIGINT, a closed terminal's
SIGHUP): every trial and the fork server end with it, and it says which trial folders
are complete. The process tree is read from /proc (Linux): fit runs in a session of its
own, so every process it started, however deep, carries that session's id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc"),
]

ROOT = Path(__file__).resolve().parents[1]

#: Batch 2 (GiB) fits a 4 GiB simulated GPU and then waits; batch 8 runs out at once.
SCRIPT = """\
import sys
import time
import torch

batch = int(sys.argv[1])
x = torch.empty(batch, 1024, 1024, 256, device="cuda")
for step in range(600):
    time.sleep(0.1)
"""


def _stat(pid: str) -> list[str]:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()  # state, ppid, pgrp, session, ...


def session_members(sid: int) -> dict[int, tuple[int, str]]:
    """pid -> (parent, state) of the live processes of session ``sid`` (zombies left out)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields and int(fields[3]) == sid and fields[0] != "Z":
                out[int(entry)] = (int(fields[1]), fields[0])
    return out


def depth(pid: int, members: dict[int, tuple[int, str]], top: int) -> int:
    steps = 0
    while pid != top and pid in members:
        pid, steps = members[pid][0], steps + 1
    return steps if pid == top else -1


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)]
)
def test_an_interrupted_fit_leaves_no_process_and_names_the_complete_trials(tmp_path, signum, code):
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_MEM_TRACK_FORKSERVER": "on"}
    argv = ["fit", "--levers=expandable", "--batch-arg=0", "--jobs=2", "4GiB:sm80", "train.py", "8"]
    fit = subprocess.Popen(
        [sys.executable, "-m", "gpu_mem_track", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # until a trial at batch 2 (or below) waits in its loop
            members = session_members(fit.pid)
            seen |= set(members)
            waiting = list((tmp_path / "reports").glob("fit-train-*/*-b[12].log"))
            trials = [pid for pid in members if depth(pid, members, fit.pid) >= 2]
            if waiting and trials:
                time.sleep(3)  # its script is in the loop by now
                break
            time.sleep(0.2)
        else:
            pytest.fail("no trial started in time")
        seen |= set(session_members(fit.pid))
        assert fit.poll() is None
        os.kill(fit.pid, signum)
        out, err = fit.communicate(timeout=60)
    finally:
        if fit.poll() is None:
            os.killpg(fit.pid, signal.SIGKILL)
    assert fit.returncode == code, err
    assert f"interrupted ({signal.Signals(signum).name}): every trial stopped" in err
    assert "complete trial folders (" in err and "/baseline" in err  # the baseline ended first
    assert "stopped, not complete (" in err and "-b" in err
    assert "Traceback" not in err and out == ""
    for _ in range(50):  # a process that just got its signal may take a moment to go
        left = session_members(fit.pid)
        if not left:
            break
        time.sleep(0.1)
    assert left == {}, f"left behind: {left} (seen: {sorted(seen)})"
    assert len(seen) >= 3  # fit, its fork server, at least one trial
