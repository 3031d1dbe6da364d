"""The ``checkpoint`` lever: activation checkpointing of the model's repeated blocks.

The model is the first module with parameters called from outside any module's forward
while autograd records (``calls.ModuleCalls``' outer hooks) that has repeated blocks (a
script that calls a small module first, an embedding, still has its model found). Its
blocks: ``repeated_blocks``, the children of one class of its ``ModuleList`` and
``Sequential`` containers (itself included), with the most parameters; two or more, all
the container's children or, beside a head or an embedding, blocks made of modules.
From then on, each call of one of those blocks made inside a forward while autograd records runs as
``torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False, **kwargs)``, as
the one-line change the report gives would; under ``no_grad`` (evaluation) the blocks
run as before. Where the change goes: the line that called the first block (in the loop
over the container, in the model's forward), or, for a ``Sequential`` that calls its
blocks itself, the line that called the container (``x = self.h(x)`` becomes ``for block
in self.h: x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``).

A Hugging Face model checkpoints its own blocks: where the blocks belong to a module
with ``supports_gradient_checkpointing`` and a switch for it (the outermost such module
holding them), the lever calls the switch before the first training forward, and that
call is the change the report gives (on the name the script called the model by, when its
line says), as the model's code is the library's, not the script's. The switch is
``activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant":
False})`` where the library has it (transformers 5), else
``gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})``.
The library then also stops returning its key/value cache in training, which a wrapper
around each block would keep. A model whose checkpointing is on already is left as it is.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, NamedTuple

from .calls import ModuleCalls
from .catalog import describe
from .records import LeverReport
from .source import Site, called_from_user, callee, caller, looped_call, wrapped_call

__all__ = ["Blocks", "CheckpointLever", "block_class", "repeated_blocks"]

_FUNCTION = "torch.utils.checkpoint.checkpoint"
#: The Hugging Face switches, newest first: (method, its keyword for checkpoint's arguments).
_SWITCHES = (
    ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
    ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
)


class Blocks(NamedTuple):
    """A model's repeated blocks: the container's ``name`` in the model ("" for the
    model itself), the ``container`` and the ``blocks`` in it (all its children, or those
    of the block class in a container that also holds others)."""

    name: str
    container: Any
    blocks: list[Any]

    @property
    def mixed(self) -> bool:
        """Whether the container holds other modules beside its blocks (a head, an
        embedding)."""
        return len(self.blocks) != sum(1 for _ in self.container.children())

    def span(self) -> str | None:
        """The blocks as a slice of the container: "" when they are all its children,
        ``"[1:9]"`` when they are one run of them, None when others sit between them."""
        if not self.mixed:
            return ""
        children = list(self.container.children())
        first = next(i for i, child in enumerate(children) if child is self.blocks[0])
        if not all(
            first + i < len(children) and children[first + i] is block for i, block in enumerate(self.blocks)
        ):
            return None
        last = first + len(self.blocks)
        return f"[{first or ''}:{last if last < len(children) else ''}]"


def block_class(block: Any) -> str:
    """The class name of ``block`` as the script wrote it: FSDP2's ``fully_shard`` swaps a
    module's class for a subclass of ``FSDPModule`` named ``FSDP<class>``."""
    cls = type(block)
    for base in cls.__mro__[1:]:
        if cls.__name__ == f"FSDP{base.__name__}":
            return base.__name__
    return cls.__name__


def repeated_blocks(model: Any, leaves: bool = False) -> Blocks | None:
    """The repeated blocks of ``model`` with the most parameters (the first found on a
    tie), None when it has none with parameters. Blocks are the children of a
    ``ModuleList``/``Sequential`` of at least two children all of one class, or, in one
    that also holds other modules (``Sequential(*blocks, head)``), its two or more
    children of one class made of modules themselves (a transformer's or a residual
    network's block, not a ``Linear`` among activations: checkpointing one ``Linear``
    keeps what it saves). With ``leaves`` such children count too (``Sequential(Linear,
    ReLU, Linear, ReLU, ...)``' ``Linear`` layers: a unit of FSDP2's sharding)."""
    import torch

    best: tuple[int, Blocks] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList | torch.nn.Sequential):
            continue
        children = list(module.children())
        by_class: dict[type, list[Any]] = {}
        for child in children:
            by_class.setdefault(type(child), []).append(child)
        for blocks in by_class.values():
            if len(blocks) < 2:
                continue
            if len(blocks) != len(children) and not leaves and not any(True for _ in blocks[0].children()):
                continue
            size = sum(p.numel() for block in blocks for p in block.parameters())
            if size and (best is None or size > best[0]):
                best = (size, Blocks(name, module, blocks))
    return None if best is None else best[1]


def checkpointing_owner(model: Any, container: Any) -> tuple[str, Any, tuple[str, str]] | None:
    """``(path, module, switch)`` of the outermost module of ``model`` (itself included:
    path "") that checkpoints its own blocks the Hugging Face way
    (``supports_gradient_checkpointing`` and one of the ``_SWITCHES``, the first it has)
    and holds ``container``; None when there is none."""
    for path, module in model.named_modules():
        if getattr(module, "supports_gradient_checkpointing", False) is not True:
            continue
        switch = next((s for s in _SWITCHES if callable(getattr(module, s[0], None))), None)
        if switch is not None and any(sub is container for sub in module.modules()):
            return path, module, switch
    return None


def _checkpointing_on(module: Any) -> bool:
    """Whether a Hugging Face model's checkpointing is on (by whichever property its
    version has; the older one warns of its deprecation in transformers 5)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
            try:
                return bool(getattr(module, name))
            except AttributeError:
                continue
    return False


class CheckpointLever:
    """See the module doc. ``report()`` once the run ended."""

    name = "checkpoint"

    def __init__(self, calls: ModuleCalls) -> None:
        calls.outer.append(self._outer)
        calls.inner.append(self._inner)
        self.model: str = ""
        self.found: Blocks | None = None
        self.seen: set[int] = set()  # ids of the modules looked into
        self.blocks: list[Any] = []  # held, so their ids stay theirs
        self.ids: frozenset[int] = frozenset()
        self.calls = 0
        self.site: Site | None = None
        self.direct = True  # the user's code calls each block (not Sequential.forward)
        #: the Hugging Face way: (the owner's path, its class name, the name the script
        #: called the model by or None, whether its checkpointing was on already, the
        #: call that turns it on, without the owner)
        self.library: tuple[str, str, str | None, bool, str] | None = None

    def _outer(self, module: Any, stack: Any) -> None:
        import torch

        if self.found is not None or id(module) in self.seen or not torch.is_grad_enabled():
            return
        self.seen.add(id(module))
        if not any(True for _ in module.parameters()):
            return
        self.model = self.model or block_class(_wrapped(module))
        self.found = repeated_blocks(module)
        if self.found is not None:
            self.model = block_class(_wrapped(module))
            self.blocks = list(self.found.blocks)
            self.ids = frozenset(id(block) for block in self.blocks)
            owner = checkpointing_owner(module, self.found.container)
            if owner is not None:
                self._through_library(*owner, caller(sys._getframe(1)))

    def _through_library(self, path: str, owner: Any, switch: tuple[str, str], site: Site | None) -> None:
        """Turn on the owner's own checkpointing (see the module doc)."""
        already = _checkpointing_on(owner)
        name = callee(site.text) if site is not None else None
        method, keyword = switch
        self.library = (
            path,
            type(owner).__name__,
            name,
            already,
            f'{method}({keyword}={{"use_reentrant": False}})',
        )
        if not already:
            getattr(owner, method)(**{keyword: {"use_reentrant": False}})

    def _inner(self, module: Any) -> Any:
        if id(module) not in self.ids:
            return None
        import torch

        if not torch.is_grad_enabled():
            return None
        if self.library is not None:  # the model checkpoints its blocks itself
            self.calls += 1
            return None
        if self.site is None:
            self.site = caller(sys._getframe(1))
            self.direct = called_from_user(sys._getframe(1))
        self.calls += 1
        return _through_checkpoint

    def report(self) -> LeverReport:
        info = describe(self.name)
        self.ids, self.blocks = frozenset(), []
        if not self.model:
            why = "no model was called with autograd recording (no training forward ran)"
        elif self.found is None:
            why = f"{self.model} has no ModuleList/Sequential of two or more blocks of one class"
        elif not self.calls:
            why = f"the blocks of {self.found.name or self.model} were never called with autograd recording"
        else:
            why = ""
        if why:  # a model without repeated blocks was reached; the others were not
            reached = self.model != "" and self.found is None
            return LeverReport(self.name, False, why, cost=info.cost, reached=reached)
        assert self.found is not None
        name, _, blocks = self.found
        detail = f"{len(blocks)} x {block_class(blocks[0])} in {name or self.model}"
        if self.library is not None:
            return self._library_report(detail, info.cost)
        detail += f" ({self.calls} block call(s) checkpointed)"
        site, change = self.site, info.change
        if site is not None:
            edit = wrapped_call if self.direct else looped_call
            change = edit(site.text, _FUNCTION, "use_reentrant=False", change)
        return LeverReport(self.name, True, "", detail, change, site.where if site else "", info.cost)

    def _library_report(self, detail: str, cost: str) -> LeverReport:
        assert self.library is not None
        path, owner, name, already, call = self.library
        if already:
            why = f"{owner} checkpoints its blocks already (its activation checkpointing is on)"
            return LeverReport(self.name, False, why, cost=cost)
        target = name or "model"
        if path and all(part.isidentifier() for part in path.split(".")):
            target += f".{path}"
        elif path:
            target += f".get_submodule({path!r})"
        detail += f", by {owner}.{call.split('(')[0]}"
        return LeverReport(self.name, True, "", detail, f"{target}.{call}", "", cost)


def _wrapped(module: Any) -> Any:
    """The model inside wrappers whose one child is their ``module`` (DDP, DataParallel,
    the fsdp2 lever's stand-in for a DDP wrap), to name it as the script does."""
    inner = getattr(module, "module", None)
    while inner is not None and list(module.children()) == [inner]:
        module, inner = inner, getattr(inner, "module", None)
    return module


def _through_checkpoint(run: Any, args: tuple, kwargs: dict) -> Any:
    from torch.utils.checkpoint import checkpoint

    return checkpoint(run, *args, use_reentrant=False, **kwargs)
