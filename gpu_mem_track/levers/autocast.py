"""The ``autocast`` lever: the model's forward under ``torch.autocast("cuda")``.

Every outermost call of a module that has parameters (the script calling its model,
``calls.ModuleCalls``) runs under ``torch.autocast("cuda", dtype=...)``: bfloat16 where
the GPU supports it (``torch.cuda.is_bf16_supported(including_emulation=False)``,
compute capability 8.0 and up; the simulated GPU answers for its capability), else
float16, which in training needs a ``GradScaler`` that this lever does not add (the
memory is the same; the report says so). The report's change is for the first call site
seen while autograd records (the training forward), and its detail names the other call
sites (an evaluation's), where the change goes too. A call the script already runs under
CUDA autocast to a lower precision is left as it is (when every call was, the lever is
not applied); one under autocast to float32 (which changes nothing, as nanoGPT's
``--dtype=float32`` does) gets the lever's autocast inside it, as the one-line change
would. A call that already computes in a lower precision without it is left as it is
too: a model whose floating-point parameters are all bfloat16 or float16 (``.to(
torch.bfloat16)``, ``torch_dtype=torch.bfloat16``: autocast casts float32 inputs of its
ops down, and there are none), and a model whose forward runs under its own autocast
(Accelerate's ``prepare_model`` with mixed precision, which the Hugging Face Trainer's
``bf16=True``/``fp16=True`` uses, wraps ``model.forward`` in it and keeps the original
as ``model._original_forward``: ``accelerate/accelerator.py``). When every call is left
so, the lever is not applied and its report says why, so that ``fit`` does not count
it as a change. The loss, computed outside the model, stays outside autocast, as with the
one-line change the report gives.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Any

from .calls import ModuleCalls
from .catalog import describe
from .records import LeverReport
from .source import Site, caller, prefixed

__all__ = ["AutocastLever"]


class AutocastLever:
    """See the module doc. ``report()`` once the run ended."""

    name = "autocast"

    def __init__(self, calls: ModuleCalls) -> None:
        calls.outer.append(self._outer)
        self.applied = 0
        self.already = 0
        self.already_why = ""  # how the calls left as they are already compute in it
        self.dtype: Any = None
        self.site: Site | None = None  # the first training call's, else the first call's
        self.sites: dict[str, Site | None] = {}  # every call site (file:line), in order
        self.trained = False  # a call with autograd recording was seen

    def _outer(self, module: Any, stack: ExitStack) -> None:
        import torch

        if not any(True for _ in module.parameters()):
            return  # a loss or an activation module, not a model
        low = _already_low(torch, module)
        if low is not None:
            self.already += 1
            self.already_why = low
            return
        if self.dtype is None:
            self.dtype = _dtype(torch)
        site = caller(sys._getframe(1))
        key = site.where if site is not None else ""
        if key not in self.sites:
            self.sites[key] = site
            if self.site is None or (torch.is_grad_enabled() and not self.trained):
                self.site = site
        self.trained = self.trained or torch.is_grad_enabled()
        self.applied += 1
        stack.enter_context(torch.autocast("cuda", dtype=self.dtype))

    def report(self) -> LeverReport:
        info = describe(self.name)
        if not self.applied:
            if self.already:
                why = f"{self.already_why}: autocast changes nothing"
            else:
                why = "the script called no model (no module with parameters called from outside a forward)"
            reached = bool(self.already)
            return LeverReport(self.name, False, why, cost=info.cost, changes_results=True, reached=reached)
        dtype = _name(self.dtype)
        detail = dtype
        others = [key for key in self.sites if self.site is None or key != self.site.where]
        if others:
            detail += f" (the model is also called at {', '.join(others)}: the change goes there too)"
        if self.already:
            detail += f" ({self.already} call(s) already under autocast kept)"
        if dtype == "float16":
            detail += "; float16 training needs a torch.amp.GradScaler, which the lever does not add"
        generic = f'with torch.autocast("cuda", dtype=torch.{dtype}):'
        change = prefixed(self.site.text, generic, generic) if self.site else generic
        cost = info.cost.replace("bfloat16", dtype)
        where = self.site.where if self.site else ""
        return LeverReport(self.name, True, "", detail, change, where, cost, True)


def _already_low(torch: Any, module: Any) -> str | None:
    """How a call of ``module`` already computes in a precision lower than float32
    (words for the report), None when it does not."""
    if torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") != torch.float32:
        return f"the script already autocasts ({_name(torch.get_autocast_dtype('cuda'))})"
    lower = (torch.bfloat16, torch.float16)
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    if dtypes and dtypes <= set(lower):
        names = " and ".join(sorted(_name(d) for d in dtypes))
        return f"the model's weights are already {names}"
    if "forward" in vars(module) and getattr(module, "_original_forward", None) is not None:
        return (
            "the model's forward already runs under Accelerate's mixed-precision autocast (Trainer bf16/fp16)"
        )
    return None


def _dtype(torch: Any) -> Any:
    try:
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # an older torch without the argument
        bf16 = torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16 else torch.float16


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
