"""The training scripts the GPU check runs: one registry line each.

Each ``Entry`` is run plainly (scripts/gpu/gpu_check_wrap.py: ``max_memory_allocated`` and
``max_memory_reserved``), under ``run --simulate <this GPU>`` and under ``run``, and its
peaks are compared in the report's one memory table. An entry with a ``kind`` is also one
of the timed loops of the runner's cost (issue 29's targets: a launch-bound loop within
1.05x of its plain time, a GPU-bound one within 1.02x). The registry's order is the order
of value: when the memory part's slot ends, the entries at the end are the ones cut.

``home`` says where ``script`` is: ``checkout`` (a path in this checkout) or ``nanogpt``
(nanoGPT's client folder, run in a temporary copy after its ``make_data.py``). An entry
whose script is not there, or that needs a module this machine lacks, is skipped with the
reason ("missing: ..."), so a line may name a script another branch adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKOUT = "checkout"
NANOGPT = "nanogpt"

#: nanoGPT's arguments as recorded on the H200 (fixtures/h200/README.md), with more
#: iterations: the timed loops' medians leave the first 5 out.
_NANOGPT = ("--eval_iters=2", "--eval_interval=1000", "--log_interval=1")
_CHAR = ("config/train_shakespeare_char.py", *_NANOGPT)
_GPT2 = (*_NANOGPT, "--batch_size=12", "--gradient_accumulation_steps=4")
#: Issue 29's targets for the runner's cost, by the kind of loop.
LAUNCH_BOUND, GPU_BOUND = 1.05, 1.02


@dataclass(frozen=True)
class Entry:
    """One training script: ``script`` and ``args`` as ``python script args`` takes them,
    in ``home``; ``family`` says what kind of program it stands for; ``kind`` (with its
    ``target`` ratio) makes it a timed loop of the runner's cost; ``needs``: modules it
    imports besides torch."""

    name: str
    family: str
    home: str
    script: str
    args: tuple[str, ...] = ()
    kind: str = ""
    target: float | None = None
    needs: tuple[str, ...] = ()


# fmt: off
REGISTRY: tuple[Entry, ...] = (
    Entry("nanogpt-char", "nanoGPT char (recorded on H200)", NANOGPT, "train.py",
          (*_CHAR, "--compile=False", "--max_iters=100"), "launch-bound", LAUNCH_BOUND, ("numpy",)),
    Entry("nanogpt-gpt2", "nanoGPT GPT-2 124M (recorded on H200)", NANOGPT, "train.py",
          (*_GPT2, "--compile=False", "--max_iters=20"), "GPU-bound", GPU_BOUND, ("numpy",)),
    Entry("resnet50-amp", "ResNet-50 AMP, plain torch (recorded on H200)", CHECKOUT,
          "scripts/check/resnet50_train.py", ("--steps", "8")),
    # Placeholders: the scripts the ViT, HF Trainer and LM-loop branches add (paths and arguments
    # to be set to theirs when merged); skipped as "missing" until then.
    Entry("vit-b16", "ViT-B/16 (timm's, plain torch), bf16", CHECKOUT, "scripts/check/vit_train.py"),
    Entry("hf-llama", "Hugging Face Trainer, Llama", CHECKOUT, "scripts/check/hf_trainer_finetune.py",
          needs=("transformers", "accelerate")),
    Entry("lm-loop", "cs336-style LM loop, fp32, no optimizer", CHECKOUT, "scripts/check/lm_benchmark.py"),
    Entry("nanogpt-char-compiled", "nanoGPT char under torch.compile", NANOGPT, "train.py",
          (*_CHAR, "--compile=True", "--max_iters=20"), needs=("numpy",)),
    Entry("convnet", "gpu_mem_track.examples convnet", CHECKOUT, "scripts/gpu/gpu_check_train.py",
          ("convnet", "--batch", "256", "--iters", "30")),
    Entry("transformer", "gpu_mem_track.examples transformer", CHECKOUT, "scripts/gpu/gpu_check_train.py",
          ("transformer", "--batch", "64", "--iters", "30")),
)
# fmt: on


@dataclass
class Workload:
    """An entry made runnable: ``argv`` after the interpreter, run in ``cwd``."""

    entry: Entry
    argv: list[str]
    cwd: Path

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def timed(self) -> bool:
        return bool(self.entry.kind)


def names() -> list[str]:
    """Every registered workload's name, in the registry's order."""
    return [entry.name for entry in REGISTRY]


def needed_modules() -> list[str]:
    """The modules some entry needs, for the check's look at the machine."""
    return sorted({module for entry in REGISTRY for module in entry.needs})


def resolve(
    entries: tuple[Entry, ...] | list[Entry],
    root: Path,
    scratch: Path,
    nanogpt: Path | None,
    nanogpt_missing: str,
    modules: dict[str, bool],
) -> tuple[list[Workload], list[tuple[str, str]]]:
    """The entries that can run here, as workloads (a checkout script runs in ``scratch``,
    a nanoGPT one in ``nanogpt``, the prepared copy), and ``(name, reason)`` for the others:
    the script is missing (``nanogpt_missing`` says why nanoGPT's is), or a module in
    ``needs`` does not import (``modules``: name -> whether it imports)."""
    ready: list[Workload] = []
    skipped: list[tuple[str, str]] = []
    for entry in entries:
        lacking = [module for module in entry.needs if not modules.get(module)]
        if entry.home == NANOGPT:
            if nanogpt is None:
                skipped.append((entry.name, f"missing: {nanogpt_missing}"))
                continue
            workload = Workload(entry, [entry.script, *entry.args], nanogpt)
        else:
            path = root / entry.script
            if not path.is_file():
                skipped.append((entry.name, f"missing: {entry.script} is not in this checkout"))
                continue
            workload = Workload(entry, [str(path), *entry.args], scratch)
        if lacking:
            skipped.append((entry.name, f"needs {', '.join(lacking)}, which does not import here"))
            continue
        ready.append(workload)
    return ready, skipped
