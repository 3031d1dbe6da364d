"""The distributed levers: FSDP2 sharding and its options, and ZeRO for a DDP script.

``fsdp2`` shards the model the script builds as a user would with FSDP2: when the script
moves a module with repeated blocks to the GPU with ``.to(...)``/``.cuda()``, each block
and then the model itself go through ``fully_shard`` first (on a one-dimensional mesh
over every rank), so the GPU only ever holds one block's full parameters on the way.
The blocks are found as the ``checkpoint`` lever finds them (``checkpoint.repeated_blocks``),
else as a container's layers of one class among parameter-free modules
(``Sequential(Linear, ReLU, Linear, ...)``' ``Linear`` layers: ``leaves``). A script
that wraps the model in ``DistributedDataParallel`` gets the sharded model back instead
(``model.module`` is the model, ``no_sync()`` does nothing). A script that initialises
no process group (written for one GPU) gets one (``init_process_group``, which the
simulated ranks make torch's fake one). Not applied: a script that shards with
``fully_shard`` itself, a model with no repeated blocks or layers, a model never moved to
the GPU with ``.to``/``.cuda`` (built there directly), a model moved by Hugging Face
Accelerate's ``prepare`` (``ACCELERATE_FSDP2``: Accelerate shards from its own config).

``no-reshard`` (``reshard_after_forward=False``), ``fsdp2-bf16``
(``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``) and
``cpu-offload`` (``CPUOffloadPolicy()``) are keywords of every ``fully_shard`` call, the
script's own or ``fsdp2``'s; not applied when nothing calls ``fully_shard``.

``zero`` builds each optimizer as ``ZeroRedundancyOptimizer(params,
optimizer_class=ITS_CLASS, **its_keywords)``, which keeps 1/world of the optimizer's
state on each rank; not applied outside a process group, with one rank, on FSDP2's
sharded parameters (whose state is sharded already), or once a Hugging Face Accelerate
``Accelerator`` exists (``ACCELERATE_ZERO``).

Each lever's cost is the communication it adds, in words and in bytes per GPU per step
from the parameters' bytes (``communication``): DDP's ring all-reduce sends about
2 (N-1)/N x the gradients' bytes; FSDP2 all-gathers the parameters twice (forward and
backward; once with ``no-reshard``) and reduce-scatters the gradients, (N-1)/N of each.
NCCL's own buffers (outside the caching allocator) are not counted anywhere.
"""

from __future__ import annotations

import sys
import threading
from contextlib import nullcontext
from pathlib import PurePath
from typing import Any

from ..units import format_bytes
from .catalog import describe
from .checkpoint import repeated_blocks
from .records import LeverReport
from .source import Site, callee, caller

__all__ = ["SHARDING_OPTIONS", "Sharding", "ShardingLever", "ZeroLever", "communication"]

#: The levers that are keywords of ``fully_shard``: name -> (keyword, source text).
SHARDING_OPTIONS = {
    "no-reshard": ("reshard_after_forward", "reshard_after_forward=False"),
    "fsdp2-bf16": (
        "mp_policy",
        "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
    ),
    "cpu-offload": ("offload_policy", "offload_policy=CPUOffloadPolicy()"),
}
_FSDP_HOMES = (
    "torch.distributed.fsdp",
    "torch.distributed._composable.fsdp",
    "torch.distributed.fsdp._fully_shard",
)


def communication(
    kind: str, param_bytes: int, world: int, options: frozenset[str] = frozenset()
) -> tuple[str, int]:
    """(words, bytes each GPU sends per step) for ``kind`` (``"ddp"``, ``"zero"``,
    ``"fsdp2"``) over ``world`` ranks, from the model's parameter bytes (its gradients
    have as many); ``options`` are the ``SHARDING_OPTIONS`` in force. Ring collectives:
    an all-reduce sends 2 (N-1)/N of its buffer, an all-gather or reduce-scatter (N-1)/N."""
    part = (world - 1) / world
    if kind == "ddp":
        sent = int(2 * part * param_bytes)
        return f"all-reduce of the gradients each step ({format_bytes(sent)} sent per GPU)", sent
    if kind == "zero":
        sent = int(3 * part * param_bytes)
        words = "all-reduce of the gradients + broadcast of the updated parameters each step"
        return f"{words} ({format_bytes(sent)} sent per GPU)", sent
    gathered = param_bytes // 2 if "fsdp2-bf16" in options else param_bytes
    gathers = 1 if "no-reshard" in options else 2
    sent = int(part * (gathers * gathered + param_bytes))
    times = "once (kept after forward)" if gathers == 1 else "twice (forward and backward)"
    words = f"all-gather of the parameters {times} + reduce-scatter of the gradients each step"
    if "cpu-offload" in options:
        words += f"; host<->GPU copies of the shards ({format_bytes(2 * param_bytes // world)} per step)"
    return f"{words} ({format_bytes(sent)} sent per GPU)", sent


class Sharding:
    """The shared patches of the FSDP2 levers: ``fully_shard`` (its keywords set from
    ``options``), and with ``shard`` the model's move to the GPU and DDP's constructor."""

    def __init__(self) -> None:
        self.shard = False
        self.options: list[str] = []
        self.script_calls = 0  # fully_shard calls of the script's own
        self.calls = 0  # every fully_shard call
        self.model: Any = None  # what the fsdp2 lever sharded
        self.found: tuple[str, int, str, str] | None = None  # (container, blocks, class, model class)
        self.span: str | None = ""  # the blocks as a slice of their container (``Blocks.span``)
        self.block_class = ""  # the blocks' class as the script's code names it (``_class_text``)
        self.param_bytes = 0
        self.world = 0
        self.site: Site | None = None
        self.ddp_site: Site | None = None
        self.error = ""
        self.started = False  # the lever started the process group (the script starts none)
        self.moved = False  # a module with repeated blocks was moved to the GPU
        self.accelerate = False  # Hugging Face Accelerate's prepare moved the model (not sharded)
        self._local = threading.local()
        self._saved: list[tuple[Any, str, Any]] = []

    def keywords(self) -> dict[str, Any]:
        """``fully_shard``'s keywords for the options in force."""
        import torch
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        out: dict[str, Any] = {}
        if "no-reshard" in self.options:
            out["reshard_after_forward"] = False
        if "fsdp2-bf16" in self.options:
            out["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if "cpu-offload" in self.options:
            out["offload_policy"] = CPUOffloadPolicy()
        return out

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def install(self) -> None:
        import importlib

        import torch

        original = importlib.import_module("torch.distributed.fsdp").fully_shard
        self._original = original
        for home in _FSDP_HOMES:
            module = importlib.import_module(home)
            if getattr(module, "fully_shard", None) is original:
                self._set(module, "fully_shard", self._fully_shard)
        if self.shard:
            to, cuda = torch.nn.Module.to, torch.nn.Module.cuda
            self._set(torch.nn.Module, "to", self._moved(to, cuda=False))
            self._set(torch.nn.Module, "cuda", self._moved(cuda, cuda=True))
            import torch.nn.parallel as parallel
            from torch.nn.parallel import distributed

            replaced = _replaced_ddp(parallel.DistributedDataParallel, self)
            self._set(parallel, "DistributedDataParallel", replaced)
            self._set(distributed, "DistributedDataParallel", replaced)

    def uninstall(self) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()
        # A module imported while the lever was on took our fully_shard by name (``from
        # torch.distributed.fsdp import fully_shard``): put torch's back there too, or the
        # bound method keeps this lever, the script's model and its namespace alive.
        ours = self._fully_shard
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict) and namespace.get("fully_shard") == ours:
                namespace["fully_shard"] = self._original

    def _fully_shard(self, module: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self._local, "ours", False):
            self.script_calls += 1
        self.calls += 1
        return self._original(module, *args, **{**kwargs, **self.keywords()})

    def _moved(self, original: Any, cuda: bool) -> Any:
        sharding = self

        def move(module: Any, *args: Any, **kwargs: Any) -> Any:
            if sharding.model is None and sharding._to_gpu(cuda, args, kwargs):
                if _from_accelerate(sys._getframe(1)):  # its prepare wraps in DDP, which refuses DTensors
                    sharding.accelerate = True
                    return original(module, *args, **kwargs)
                sharding._try_shard(module, caller(sys._getframe(1)))
                if sharding.model is module and "cpu-offload" in sharding.options:
                    return module  # offloaded shards stay on the CPU; fully_shard moved the buffers
            return original(module, *args, **kwargs)

        return move

    @staticmethod
    def _to_gpu(cuda: bool, args: tuple, kwargs: dict) -> bool:
        import torch

        if cuda:
            return True
        try:
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
        except (TypeError, RuntimeError):
            return False
        return device is not None and device.type == "cuda"

    def _try_shard(self, module: Any, site: Site | None) -> None:
        from torch.distributed.fsdp import FSDPModule

        if self.script_calls or isinstance(module, FSDPModule) or not any(True for _ in module.parameters()):
            return
        found = repeated_blocks(module) or repeated_blocks(module, leaves=True)
        if found is None:
            return
        self.moved = True
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        try:
            if not dist.is_initialized():
                dist.init_process_group("nccl")
                self.started = True
            mesh = init_device_mesh("cuda", (dist.get_world_size(),))
        except (RuntimeError, ValueError) as exc:
            self.error = f"no process group could start ({str(exc).splitlines()[0]}): run it under torchrun"
            return
        name, blocks = found.name, found.blocks
        self.span = found.span()
        self.param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
        self.world, self.site, self.model = dist.get_world_size(), site, module
        self.found = (name, len(blocks), type(blocks[0]).__name__, type(module).__name__)
        self.block_class = _class_text(type(blocks[0]))
        self._local.ours = True
        try:
            for block in blocks:
                self._fully_shard(block, mesh=mesh)
            self._fully_shard(module, mesh=mesh)
        finally:
            self._local.ours = False


def _class_text(cls: type) -> str:
    """``cls`` as code names it: ``torch.nn.Linear`` for one of ``torch.nn``'s layers (the
    script may import it under any name), else its own name (the script's class)."""
    import torch

    if cls.__module__.startswith("torch.") and getattr(torch.nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return cls.__name__


def _replaced_ddp(real: type, sharding: Sharding) -> type:
    """A subclass of DDP (so ``isinstance`` holds) whose construction around the model
    ``sharding`` sharded gives the sharded model back (``_unwrapped``). A subclass, not
    a ``__new__`` set on DDP itself: CPython cannot take such a ``__new__`` back off a
    class (``object.__new__`` then refuses the arguments)."""

    class DistributedDataParallel(real):  # type: ignore[misc, valid-type]
        def __new__(cls, module: Any = None, *args: Any, **kwargs: Any) -> Any:
            if module is not None and module is sharding.model:
                sharding.ddp_site = caller(sys._getframe(1))
                return _unwrapped(module)
            return super().__new__(cls)

    DistributedDataParallel.__qualname__ = real.__qualname__
    DistributedDataParallel.__module__ = real.__module__
    return DistributedDataParallel


_WRAPPER: list[type] = []


def _unwrapped(module: Any) -> Any:
    """The sharded model where the script wrapped it in DDP: a module whose ``.module``
    is the model, whose call is the model's and whose ``no_sync()`` does nothing."""
    import torch

    if not _WRAPPER:

        class ShardedModel(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.module = inner

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                return self.module(*args, **kwargs)

            def no_sync(self) -> Any:
                return nullcontext()

        _WRAPPER.append(ShardedModel)
    return _WRAPPER[0](module)


class ShardingLever:
    """``fsdp2`` or one of ``SHARDING_OPTIONS``; reports from the shared ``Sharding``."""

    def __init__(self, name: str, sharding: Sharding) -> None:
        self.name, self.sharding = name, sharding
        if name == "fsdp2":
            sharding.shard = True
        else:
            sharding.options.append(name)

    def report(self) -> LeverReport:
        s, info = self.sharding, describe(self.name)
        options = frozenset(s.options)
        if self.name != "fsdp2":
            if not s.calls:
                why = "nothing calls fully_shard: the script does not shard with FSDP2 (combine with fsdp2)"
                return LeverReport(self.name, False, why, cost=info.cost)
            keyword = SHARDING_OPTIONS[self.name][1]
            where = s.site.where if s.site is not None and not s.script_calls else ""
            cost = "" if s.found is not None else info.cost  # fsdp2's cost counts its options
            change = "" if s.found is not None else f"fully_shard(module, {keyword})"  # fsdp2's line has it
            return LeverReport(
                self.name, True, "", keyword, change, where, cost, changes_results=info.changes_results
            )
        if s.found is None:
            return LeverReport(
                self.name, False, self._why_not(), cost=info.cost, reached=s.moved or bool(s.script_calls)
            )
        name, count, block, model = s.found
        words, sent = communication("fsdp2", s.param_bytes, s.world, options)
        detail = f"{count} x {block} in {name or model} + the root {model}, over {s.world} ranks"
        detail += f" ({format_bytes(s.param_bytes)} of parameters; {sent} bytes sent per GPU per step)"
        target = (callee(s.site.text) if s.site is not None else None) or "model"
        target = target.split(".")[0] if "." in target and "(" not in target else target
        keywords = "".join(f", {SHARDING_OPTIONS[o][1]}" for o in s.options)
        blocks = f"{target}.{name}" if name else target
        if s.span is None:  # others between the blocks: pick them by class
            blocks = f"(b for b in {blocks} if isinstance(b, {s.block_class}))"
        else:
            blocks += s.span
        change = f"for block in {blocks}: fully_shard(block{keywords}); fully_shard({target}{keywords})"
        if s.ddp_site is not None:
            change += f" (instead of the DDP wrap at {PurePath(s.ddp_site.file).name}:{s.ddp_site.line})"
        if s.started:  # a script written for one GPU
            change = f"dist.init_process_group('nccl'); {change}"
            detail += "; the script starts no process group: the lever started it"
        where = s.site.where if s.site is not None else ""
        return LeverReport(self.name, True, "", detail, change, where, words)

    def _why_not(self) -> str:
        s = self.sharding
        if s.script_calls:
            return "the script shards with fully_shard itself"
        if s.error:
            return s.error
        if s.accelerate and not s.moved:
            return ACCELERATE_FSDP2
        if not s.moved:
            return (
                "no module with repeated blocks or layers was moved to the GPU with .to()/.cuda() "
                "(a model built on the GPU directly is not sharded)"
            )
        return "not applied"


class ZeroLever:
    """``zero``: each optimizer built as a ``ZeroRedundancyOptimizer`` (module doc)."""

    name = "zero"

    def __init__(self) -> None:
        self.built: list[str] = []
        self.why = ""
        self.site: Site | None = None
        self.param_bytes = 0
        self.world = 0
        self._local = threading.local()
        self._saved: list[tuple[str, type]] = []

    def install(self) -> None:
        import torch

        for name, value in list(vars(torch.optim).items()):
            if isinstance(value, type) and issubclass(value, torch.optim.Optimizer):
                if value is not torch.optim.Optimizer:
                    self._saved.append((name, value))
                    setattr(torch.optim, name, self._replaced(value))

    def uninstall(self) -> None:
        import torch

        for name, value in self._saved:
            setattr(torch.optim, name, value)
        self._saved.clear()

    def _replaced(self, real: type) -> type:
        """A subclass of the optimizer class ``real`` (its name, signature and
        ``isinstance`` kept) whose construction may give ZeRO's optimizer instead
        (``_new``); see ``_replaced_ddp`` for why not a ``__new__`` on ``real``."""
        lever = self

        def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
            return lever._new(real, cls, *args, **kwargs)

        replaced = type(real.__name__, (real,), {"__new__": __new__, "__module__": real.__module__})
        replaced.__qualname__ = real.__qualname__
        return replaced

    def _new(self, real: type, cls: Any, *args: Any, **kwargs: Any) -> Any:
        """The optimizer for ``cls(*args, **kwargs)``. ZeRO's, or ``real``'s built here
        from the same arguments: neither is an instance of ``cls`` (the replaced class),
        so Python does not call ``__init__`` again on the arguments read here."""
        if getattr(self._local, "inside", False) or cls.__dict__.get("__new__") is None:
            return object.__new__(cls)  # a subclass of the script's own: left as it is
        params = _listed(args[0] if args else kwargs.pop("params", None))
        rest = args[1:]
        why = self._refused(params, rest)
        if why:
            self.why = self.why or why
            return real(params, *rest, **kwargs)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
        self.param_bytes += sum(t.numel() * t.element_size() for t in tensors)
        self.site = self.site or caller(sys._getframe(1))
        self._local.inside = True
        try:
            optimizer = ZeroRedundancyOptimizer(params, optimizer_class=real, **kwargs)
        finally:
            self._local.inside = False
        self.built.append(real.__name__)
        return optimizer

    def _refused(self, params: Any, rest: tuple) -> str:
        """Why this optimizer is built as it is ("": it becomes ZeRO's)."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        if rest or not isinstance(params, list):
            return (
                "the optimizer's arguments are given by position (ZeroRedundancyOptimizer takes them by name)"
            )
        if not dist.is_available() or not dist.is_initialized():
            return (
                "the optimizer is built outside a process group "
                "(not a distributed script, or it starts one later)"
            )
        self.world = dist.get_world_size()
        if self.world < 2:
            return "one rank: there is nothing to shard the optimizer's state over"
        tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
        if any(isinstance(t, DTensor) for t in tensors):
            return "the model is sharded with FSDP2: its optimizer's state is sharded already"
        if _accelerator_made():
            return ACCELERATE_ZERO
        return ""

    def report(self) -> LeverReport:
        info = describe(self.name)
        if not self.built:
            return LeverReport(
                self.name, False, self.why or "no optimizer was built", cost=info.cost, reached=bool(self.why)
            )
        words, sent = communication("zero", self.param_bytes, self.world)
        detail = f"{', '.join(self.built)} as ZeroRedundancyOptimizer over {self.world} ranks"
        detail += f" ({sent} bytes sent per GPU per step)"
        text = self.site.text if self.site is not None else ""
        change = _zero_line(text) or describe(self.name).change
        return LeverReport(self.name, True, "", detail, change, self.site.where if self.site else "", words)


#: Why the levers leave a Hugging Face Accelerate script alone: its ``prepare`` wraps the
#: model in DDP (which refuses FSDP2's DTensor parameters) and the optimizer in an
#: ``AcceleratedOptimizer`` (which reads its state dict at once, which
#: ``ZeroRedundancyOptimizer`` refuses before a consolidation). Accelerate shards from
#: its own configuration instead.
ACCELERATE_FSDP2 = (
    "the model is moved by Hugging Face Accelerate's prepare, which wraps it in DDP: shard it with "
    "Accelerate's FSDP2 (accelerate launch --use_fsdp --fsdp_version 2, or "
    "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))), not simulated here"
)
ACCELERATE_ZERO = (
    "an Accelerator exists: its prepare reads the optimizer's state dict, which ZeroRedundancyOptimizer "
    "refuses; shard the optimizer's state with Accelerate's DeepSpeed ZeRO or FSDP2 instead"
)


def _from_accelerate(frame: Any) -> bool:
    """Whether ``frame`` (a ``.to()``/``.cuda()`` call's caller) is Hugging Face Accelerate's."""
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "accelerate" or name.startswith("accelerate.")


def _accelerator_made() -> bool:
    """Whether Hugging Face Accelerate's process state exists (an ``Accelerator`` or a
    ``PartialState`` was made), read without importing it."""
    state = getattr(sys.modules.get("accelerate.state"), "PartialState", None)
    return bool(getattr(state, "_shared_state", None))


def _listed(params: Any) -> Any:
    """An optimizer's ``params`` read once into lists (each group's ``params`` too), so
    they can be looked at and still given to the optimizer; None stays None."""
    import torch

    if params is None:
        return None
    items = [params] if isinstance(params, torch.Tensor) else list(params)
    out = []
    for item in items:
        if isinstance(item, dict):
            inner = item.get("params", ())
            item = {**item, "params": [inner] if isinstance(inner, torch.Tensor) else list(inner)}
        out.append(item)
    return out


def _zero_line(text: str) -> str:
    """``text`` (``opt = Cls(params, k=v)``, one line) as ``opt =
    ZeroRedundancyOptimizer(params, k=v, optimizer_class=Cls)``; "" for any other line."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    node = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.value, ast.Call):
        return ""
    call = node.value
    segment = lambda part: ast.get_source_segment(text, part) or ""  # noqa: E731
    parts = [segment(arg) for arg in call.args]
    parts += [f"{k.arg}={segment(k.value)}" if k.arg else f"**{segment(k.value)}" for k in call.keywords]
    parts.append(f"optimizer_class={segment(call.func)}")
    return f"{segment(node.targets[0])} = ZeroRedundancyOptimizer({', '.join(parts)})"
