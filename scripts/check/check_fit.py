"""Check the advisor (``gpu-mem-track fit``) against nanoGPT edited by hand.

The test client ``clients/nanogpt`` of the H200 fixture folder (``--fixtures``, else
``shared/fixtures/h200`` beside the checkout or one level up) is copied to a temporary
folder and its ``make_data.py`` run there. Then, in subprocesses of this checkout:

1. ``python -m gpu_mem_track fit --batch-arg=--batch_size --json GPU train.py ARGS``:
   the advisor on GPT-2 124M at batch 32 (``--gpu``, default RTX-4090, a 24 GB GPU),
   timed: its wall time is the figure for issue 23's "under 2 minutes here";
2. for every change the advisor's table holds (each lever it applied, alone or combined,
   at the script's batch and at the largest batch it says fits), the same change made
   by hand in another copy of the client (:data:`EDITS`: an environment variable, an
   edited line of ``model.py`` or ``train.py``, the ``--batch_size`` argument), run with
   ``python -m gpu_mem_track run --simulate GPU`` without any lever: its peak allocated
   and reserved, and whether it ran out of memory, against the advisor's figures (the
   same bytes expected); and at the largest batch plus one, which must not fit.

A lever the advisor applied for which no hand edit is known here is listed as such (the
check then fails: every suggested change must be checked). Writes ``reports/fit_check.md``
(``--out``) and a ``.json`` beside it; exit code 1 when a figure differs.

    python scripts/check/check_fit.py [--fixtures DIR] [--gpu RTX-4090] [--batch 32] \
        [--out reports/fit_check.md]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the package, and scripts/_common

from _common.fixtures import shown  # noqa: E402

#: nanoGPT's arguments here: GPT-2 124M (train.py's defaults: block 1024, 40 micro-steps of
#: gradient accumulation, bf16 autocast, fused AdamW) without torch.compile, as a user runs it.
NANOGPT_ARGS = ["--compile=False"]
#: The temporary folders' paths, left out of the reports (a file is named from the client's folder).
TEMPORARY = re.compile(r"/\S*?check_fit-[^/]+/(?:nanogpt/|fit/)?")
CHECKPOINT_IMPORT = ("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.utils.checkpoint\n")
CHECKPOINT_CALL = (
    "            x = block(x)\n",
    "            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\n",
)


@dataclass(frozen=True)
class Edit:
    """A change made by hand: ``env`` added to the environment, ``(file, old, new)``
    replacements (each ``old`` must occur exactly once)."""

    env: tuple[tuple[str, str], ...] = ()
    replace: tuple[tuple[str, str, str], ...] = ()


#: The hand edits of nanoGPT (karpathy/nanoGPT 3adf61e1) per lever name.
EDITS: dict[str, Edit] = {
    "expandable": Edit(env=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
    "checkpoint": Edit(replace=(("model.py", *CHECKPOINT_IMPORT), ("model.py", *CHECKPOINT_CALL))),
}


def fixture_client(given: Path | None) -> Path:
    """The nanoGPT client folder (``SystemExit`` when none is found)."""
    candidates = [given] if given else []
    candidates += [ROOT.parent / "shared/fixtures/h200", ROOT.parent.parent / "shared/fixtures/h200"]
    for folder in candidates:
        if (folder / "clients/nanogpt/train.py").is_file():
            return folder / "clients/nanogpt"
    raise SystemExit("no H200 fixture folder with clients/nanogpt found: give --fixtures DIR")


def prepared_copy(client: Path, where: Path) -> Path:
    """A copy of the client in ``where`` with its data made (``make_data.py``)."""
    shutil.copytree(client, where)
    subprocess.run([sys.executable, "make_data.py"], cwd=where, check=True, capture_output=True)
    return where


def edited_copy(base: Path, where: Path, levers: tuple[str, ...]) -> tuple[Path, dict[str, str]] | None:
    """A copy of ``base`` with the hand edits of ``levers`` made, and the environment they
    add; None when a lever has no hand edit here."""
    if any(name not in EDITS for name in levers):
        return None
    shutil.copytree(base, where, symlinks=True)
    env: dict[str, str] = {}
    for name in levers:
        edit = EDITS[name]
        env.update(edit.env)
        for file, old, new in edit.replace:
            path = where / file
            text = path.read_text()
            if text.count(old) != 1:
                raise SystemExit(f"the hand edit of {name} did not find its line once in {file}: {old!r}")
            path.write_text(text.replace(old, new))
    return where, env


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH`` and ``extra``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(extra or {})
    return env


def simulated_peak(folder: Path, gpu: str, args: list[str], env: dict[str, str], out: Path) -> dict:
    """``run --simulate`` of ``folder``'s train.py: exit code, peaks, out of memory."""
    command = [sys.executable, "-m", "gpu_mem_track", "run", "--simulate", gpu, "--out-dir", str(out)]
    command += ["--run-name", "run", "train.py", *args]
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=folder, env=child_env(env), capture_output=True, text=True, timeout=1200
    )
    meta_path = out / "run" / "meta.json"
    if not meta_path.is_file():
        raise SystemExit(f"the hand-edited run in {folder} wrote no meta.json:\n{done.stderr[-3000:]}")
    meta = json.loads(meta_path.read_text())
    oom = (meta.get("simulation") or {}).get("out_of_memory")
    return {
        "exit_code": meta.get("exit_code"),
        "peak": meta.get("peak"),
        "reserved_peak": meta.get("reserved_peak"),
        "out_of_memory": oom is not None,
        "seconds": round(time.perf_counter() - started, 1),
    }


def advise(folder: Path, gpu: str, args: list[str], out: Path) -> tuple[dict, float]:
    """``fit --json`` in ``folder``: the advisor's answer (``FitResult.to_dict()``) and
    its wall seconds."""
    command = [sys.executable, "-m", "gpu_mem_track", "fit", "--batch-arg=--batch_size", "--json"]
    command += ["--out-dir", str(out), gpu, "train.py", *args]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=child_env(), capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"fit failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout), seconds


def with_batch(args: list[str], batch: int) -> list[str]:
    """``args`` with ``--batch_size`` set to ``batch``."""
    return [a for a in args if not a.startswith("--batch_size=")] + [f"--batch_size={batch}"]


@dataclass(frozen=True)
class Case:
    """One hand-edited run to make: the row it checks, the levers edited in, the batch,
    and what the advisor says of it (``expected``: peak, reserved_peak, out_of_memory;
    None: only that it does not fit)."""

    label: str
    levers: tuple[str, ...]
    batch: int
    expected: dict | None


def cases(answer: dict, batch: int) -> tuple[list[Case], list[str]]:
    """The hand-edited runs that check ``answer``'s rows, and the levers it applied that
    have no hand edit here."""
    made: list[Case] = []
    missing: list[str] = []
    for row in answer["rows"]:
        if row["fits"] == "failed":
            continue
        levers = tuple(row["levers"])
        lacking = [name for name in levers if name not in EDITS]
        if lacking:
            missing += [name for name in lacking if name not in missing]
            continue
        oom = row["fits"] == "no"
        expected = {"peak": row["peak"], "reserved_peak": row["reserved_peak"], "out_of_memory": oom}
        made.append(Case(row["label"], levers, batch, expected))
        answer_batch = row.get("batch")
        if answer_batch and answer_batch["batch"] > 0:
            best = answer_batch["batch"]
            if best != batch:
                made.append(
                    Case(row["label"], levers, best, {"reserved_peak": answer_batch["reserved_peak"]})
                )
            made.append(Case(row["label"], levers, best + 1, None))
    return made, missing


def check_case(case: Case, base: Path, work: Path, gpu: str, args: list[str], index: int) -> dict:
    """Run ``case`` by hand and compare it with the advisor's figures."""
    copy = edited_copy(base, work / f"edit{index}", case.levers)
    assert copy is not None
    folder, env = copy
    got = simulated_peak(folder, gpu, with_batch(args, case.batch), env, work / f"runs{index}")
    if case.expected is None:
        ok = got["out_of_memory"]
        said = "does not fit"
    else:
        ok = all(got[key] == value for key, value in case.expected.items())
        said = ", ".join(f"{key} {value}" for key, value in case.expected.items())
    return {
        "label": case.label,
        "levers": list(case.levers),
        "batch": case.batch,
        "advisor": said,
        **got,
        "ok": ok,
    }


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:,.3f} GiB"


def write_report(
    out: Path,
    gpu: str,
    args: list[str],
    answer: dict,
    seconds: float,
    rows: list[dict],
    missing: list[str],
    client: Path,
) -> None:
    """reports/fit_check.md and its .json."""
    lines = [
        "# The advisor against nanoGPT edited by hand",
        "",
        f"`python scripts/check/check_fit.py --gpu {gpu}` on `{shown(client)}` (GPT-2 124M), "
        f"`train.py {' '.join(args)}` on the simulated {gpu}.",
        "",
        f"`gpu-mem-track fit --batch-arg=--batch_size {gpu} train.py {' '.join(args)}`: verdict "
        f"**{answer['verdict']}**, recommended: {answer.get('recommended') or '-'}; "
        f"{answer['trials']} simulated trials in **{seconds:.0f} s** wall time on this machine "
        f"({os.cpu_count()} cores).",
        "",
        "| row | fits | peak allocated | peak reserved | margin | largest batch |",
        "|---|---|---|---|---|---|",
    ]
    for row in answer["rows"]:
        best = row.get("batch")
        lines.append(
            f"| {row['label']} | {row['fits']} | {gib(row['peak'])} | {gib(row['reserved_peak'])} | "
            f"{gib(row['margin'])}{' (at least)' if row['at_least'] else ''} | "
            f"{best['batch'] if best else '-'} |"
        )
    lines += ["", "Not applied: " + ("; ".join(f"{a} ({b})" for a, b in answer["not_applied"]) or "none"), ""]
    lines += [
        "Each change made by hand (an environment variable, `model.py` edited, `--batch_size`) and run with "
        "`run --simulate` without levers, against the advisor's figures:",
        "",
        "| row | batch | the advisor says | hand-edited: peak allocated | peak reserved | out of memory "
        "| same |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['batch']} | {row['advisor']} | {row['peak']} | "
            f"{row['reserved_peak']} | {'yes' if row['out_of_memory'] else 'no'} | "
            f"{'yes' if row['ok'] else '**no**'} |"
        )
    if missing:
        lines += ["", f"Applied by the advisor with no hand edit here (not checked): {', '.join(missing)}."]
    out.write_text(TEMPORARY.sub("", "\n".join(lines) + "\n"))
    data = {
        "gpu": gpu,
        "args": args,
        "seconds": round(seconds, 1),
        "answer": answer,
        "hand": rows,
        "missing": missing,
    }
    out.with_suffix(".json").write_text(TEMPORARY.sub("", json.dumps(data, indent=1) + "\n"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, help="the H200 fixture folder (holding clients/nanogpt)")
    parser.add_argument("--gpu", default="RTX-4090", help="the simulated GPU (default: RTX-4090, 24 GB)")
    parser.add_argument("--batch", type=int, default=32, help="nanoGPT's --batch_size (default: 32)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "fit_check.md")
    parser.add_argument("--jobs", type=int, default=2, help="hand-edited runs at once (default: 2)")
    options = parser.parse_args(argv)
    client = fixture_client(options.fixtures)
    args = [*NANOGPT_ARGS, f"--batch_size={options.batch}"]
    with tempfile.TemporaryDirectory(prefix="check_fit-") as tmp:
        work = Path(tmp)
        base = prepared_copy(client, work / "nanogpt")
        print(f"check_fit: fit {options.gpu} train.py {' '.join(args)} ...", file=sys.stderr, flush=True)
        answer, seconds = advise(base, options.gpu, args, work / "fit")
        print(
            f"check_fit: the advisor took {seconds:.0f} s: {answer['verdict']}", file=sys.stderr, flush=True
        )
        made, missing = cases(answer, options.batch)
        with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
            futures = [
                pool.submit(check_case, case, base, work, options.gpu, args, index)
                for index, case in enumerate(made)
            ]
            rows = [future.result() for future in futures]
    for row in rows:
        print(
            f"check_fit: {row['label']} batch {row['batch']}: {'same' if row['ok'] else 'DIFFERS'}",
            file=sys.stderr,
        )
    write_report(options.out, options.gpu, args, answer, seconds, rows, missing, client)
    print(f"Wrote {options.out}", file=sys.stderr)
    return 0 if all(row["ok"] for row in rows) and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
