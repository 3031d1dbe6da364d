"""The HTML report's screenshots in reports/: a run, a comparison, a launch, a snapshot.

    python scripts/tools/html_screenshots.py [--snapshot FILE.pickle.gz] [--out-dir reports]

Runs a small CPU training script (three Adam steps of an MLP, ``track()`` stamps) under
``gpu_mem_track run --memory tensors`` at batch 64 and 256, and as two ranks of one
launch (``RANK``/``WORLD_SIZE`` set as torchrun sets them); writes each page with the
``html`` command, the snapshot's from ``--snapshot`` (default: the recorded training step
among the shared fixtures, ``../shared/fixtures/snapshots`` beside the checkout; read,
never copied); and takes a 1280-pixel-wide screenshot of each page in headless Chromium:
``html_run.png``, ``html_report.png`` (the comparison), ``html_launch.png``,
``html_snapshot.png``. Needs ``chromium`` on the PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "snapshots" / "transformer-2.7b-ctx128-train-step.pickle.gz"

WORKLOAD = """\
import sys

import torch

from gpu_mem_track import MemTracker


def step(model, optimizer, batch):
    x = torch.randn(batch, 1024)
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def main(batch):
    tracker = MemTracker(verbosity=0, probe=False, out_dir=None)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
    tracker.track("model built")
    optimizer = torch.optim.Adam(model.parameters())
    for i in range(3):
        step(model, optimizer, batch)
        tracker.track(f"step {i}")


main(int(sys.argv[1]))
"""


def gmt(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -m gpu_mem_track ARGS`` in ``cwd`` with this checkout first on the path."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-m", "gpu_mem_track", *map(str, args)]
    return subprocess.Popen(
        command, cwd=cwd, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def wait(*started: subprocess.Popen[str]) -> None:
    for process in started:
        _, err = process.communicate(timeout=600)
        if process.returncode:
            sys.exit(f"{' '.join(process.args)} failed:\n{err[-2000:]}")


def make_runs(work: Path) -> None:
    """reports/batch64, reports/batch256 and the launch reports/launch (two ranks)."""
    (work / "train.py").write_text(WORKLOAD, encoding="utf-8")
    run = ("run", "--memory", "tensors", "--out-dir", "reports")
    for batch in (64, 256):
        wait(gmt(*run, "--run-name", f"batch{batch}", "train.py", str(batch), cwd=work))
    ranks = {"RANK": "{k}", "LOCAL_RANK": "{k}", "WORLD_SIZE": "2"}
    wait(
        *(
            gmt(*run, "--run-name", "launch", "train.py", str(64 * (k + 1)), cwd=work, env=_filled(ranks, k))
            for k in range(2)
        )
    )


def _filled(env: dict[str, str], k: int) -> dict[str, str]:
    return {name: value.format(k=k) for name, value in env.items()}


def screenshot(page: Path, image: Path, height: int) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("needs chromium on the PATH (apt-get install chromium)")
    flags = [
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--hide-scrollbars",
        f"--window-size=1280,{height}",
    ]
    command = [browser, *flags, f"--screenshot={image}", page.as_uri()]
    subprocess.run(command, capture_output=True, timeout=120)
    if not image.is_file():
        sys.exit(f"chromium wrote no {image}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", type=Path, default=FIXTURE, help="a memory snapshot (.pickle[.gz])")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "reports", help="where the images go")
    args = parser.parse_args()
    if not args.snapshot.is_file():
        sys.exit(f"no snapshot at {args.snapshot}: give one with --snapshot")
    pages = {
        "html_run": (["reports/batch64"], 1100),
        "html_report": (["reports/batch64", "reports/batch256"], 1300),
        "html_launch": (["reports/launch"], 1250),
        "html_snapshot": ([args.snapshot.resolve()], 1500),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu_mem_track-shots-") as temporary:
        work = Path(temporary)
        make_runs(work)
        for name, (inputs, height) in pages.items():
            page = work / f"{name}.html"
            wait(gmt("html", *inputs, "-o", page, cwd=work))
            screenshot(page, args.out_dir / f"{name}.png", height)
            print(f"wrote {args.out_dir / f'{name}.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
