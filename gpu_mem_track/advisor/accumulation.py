"""How to keep the batch the user asked for with a smaller one: gradient accumulation.

When nothing fits at the user's batch ``B`` and the best change fits batch ``b < B``, the
same effective batch is about ``B / k`` samples per step over ``k`` accumulation steps,
``k = ceil(B / b)`` the fewest steps that can hold it: ``ceil(B / k)`` samples per step
(32 at most 27: 16 x 2; 33 at most 27: 17 x 2, 34 samples, one more than asked). How to set
``k`` is said only where the script has a gradient-accumulation argument: an option of
the script's arguments (``--gradient_accumulation_steps=4``: its value times ``k``), an
option the script defines (``"--gradient_accumulation_steps"`` in its text), or the
Hugging Face Trainer's ``TrainingArguments(gradient_accumulation_steps=...)`` (its
command line where it is read by ``HfArgumentParser``). Pure functions of the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .records import Accumulation

__all__ = ["accumulation", "split_batch"]

#: The names a gradient-accumulation option goes by (nanoGPT, Hugging Face, Lightning, others).
_NAME = (
    r"(?:gradient[_-]accumulation[_-]steps|grad[_-]accum(?:ulation)?(?:[_-]steps)?"
    r"|accum(?:ulation)?[_-]steps|accumulate[_-]grad[_-]batches)"
)
_OPTION = re.compile(rf"^(--?{_NAME})(?:=(.*))?$")
_DEFINED = re.compile(rf"""["'](--?{_NAME})["']""")


def split_batch(batch: int, fits: int) -> tuple[int, int]:
    """``(per_step, steps)``: ``batch`` samples as ``steps`` steps of at most ``fits``
    (see the module doc); ``steps >= 2`` when ``fits < batch``."""
    if fits < 1:
        raise ValueError(f"no batch fits ({fits})")
    steps = -(-batch // fits)
    return -(-batch // steps), steps


def accumulation(script_text: str, args: Sequence[str], batch: int, fits: int) -> Accumulation | None:
    """How to run ``batch`` samples per optimizer step when at most ``fits`` fit, with
    the script's own gradient-accumulation argument; None when the script has none (or
    ``fits`` is not below ``batch``)."""
    if not 1 <= fits < batch:
        return None
    per_step, steps = split_batch(batch, fits)
    how = _how(script_text, args, steps)
    if how is None:
        return None
    return Accumulation(batch=per_step, steps=steps, how=how)


def _how(text: str, args: Sequence[str], steps: int) -> str | None:
    """The change that sets ``steps`` accumulation steps, in the script's own terms; the
    steps the script has now (its argument's value or default) are multiplied."""
    for i, token in enumerate(args):
        found = _OPTION.match(token)
        if found is None:
            continue
        value = found.group(2)
        if value is None and i + 1 < len(args):
            value = args[i + 1]
        return _times(found.group(1), _int(value), steps)
    defined = _DEFINED.search(text)
    if defined is not None:  # argparse's add_argument("--gradient_accumulation_steps", ..., default=N)
        call = text[defined.end() : defined.end() + 300].split(")", 1)[0]
        default = re.search(r"default\s*=\s*(\d+)", call)
        return _times(defined.group(1), _int(default.group(1) if default else None), steps)
    glob = re.search(rf"^({_NAME})\s*=\s*([\d\s*]+?)\s*(?:#.*)?$", text, re.MULTILINE)
    if glob is not None and "configurator" in text:  # nanoGPT: globals set by --name=value
        return _times(f"--{glob.group(1)}", _product(glob.group(2)), steps)
    if "TrainingArguments" not in text:
        return None
    if "HfArgumentParser" in text:
        return _times("--gradient_accumulation_steps", 1, steps)
    given = re.search(r"\bgradient_accumulation_steps\s*=\s*(\d+)", text)
    now = int(given.group(1)) if given is not None else 1
    more = f" ({now} x {steps})" if now > 1 else ""
    return f"TrainingArguments(gradient_accumulation_steps={now * steps}){more}"


def _times(option: str, now: int, steps: int) -> str:
    more = f" ({now} x {steps})" if now > 1 else ""
    return f"{option}={now * steps}{more}"


def _int(text: str | None) -> int:
    try:
        return max(1, int(text)) if text is not None else 1
    except ValueError:
        return 1


def _product(text: str) -> int:
    """``"5 * 8"`` as 40 (nanoGPT's default is written so)."""
    out = 1
    for part in text.split("*"):
        out *= _int(part.strip())
    return out
