"""``applied_levers``: the named levers, in force while a block runs.

The runner enters it before the simulated GPU starts and before the script's first
line (``runner.run.execute``), and takes the reports when the script has ended. Entering
it imports torch (the model and optimizer levers patch ``torch.nn.Module.__call__``,
``torch.optim``'s constructors and ``zero_grad``) but does not start CUDA; exiting
restores everything, also after an exception.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from .catalog import check_levers
from .records import LeverReport

__all__ = ["AppliedLevers", "applied_levers"]


class AppliedLevers:
    """The levers of one run, in the order given; ``reports()`` says what each did."""

    def __init__(self, levers: Sequence[Any]) -> None:
        self.levers = tuple(levers)

    def reports(self) -> list[LeverReport]:
        """One report per lever, in the order given (call once the script has ended)."""
        return [lever.report() for lever in self.levers]


@contextmanager
def applied_levers(names: Sequence[str], simulated: bool) -> Iterator[AppliedLevers]:
    """The levers ``names`` (``catalog.LEVERS``; checked: ``UsageError`` for an unknown
    or repeated name) in force while the block runs; ``simulated``: the run is on the
    simulated GPU. Yields an
    :class:`AppliedLevers`; no names: nothing is patched and torch is not imported."""
    names = check_levers(names)
    if not names:
        yield AppliedLevers(())
        return
    levers, installs = _build(names, simulated)
    with ExitStack() as stack:
        for install in installs:
            install.install()
            stack.callback(install.uninstall)
        yield AppliedLevers(levers)


def _build(names: Sequence[str], simulated: bool) -> tuple[list[Any], list[Any]]:
    """The lever objects in the order of ``names``, and what to install (each shared
    patch once, after the levers that use it registered)."""
    from .allocator import AllocatorLever
    from .autocast import AutocastLever
    from .calls import ModuleCalls
    from .checkpoint import CheckpointLever
    from .optimizer import FusedLever, GradsToNoneLever, NoForeachLever, OptimizerBuilds

    calls, builds = ModuleCalls(), OptimizerBuilds()
    levers: list[Any] = []
    sharding = _sharding_levers(names, levers)
    for name in names:
        if name in sharding:
            continue
        if name in ("expandable", "gc-threshold"):
            levers.append(AllocatorLever(name, simulated))
        elif name == "autocast":
            levers.append(AutocastLever(calls))
        elif name == "checkpoint":
            levers.append(CheckpointLever(calls))
        elif name == "fused":
            levers.append(FusedLever(builds))
        elif name == "no-foreach":
            levers.append(NoForeachLever(builds))
        else:
            levers.append(GradsToNoneLever())
    levers.sort(key=lambda lever: list(names).index(lever.name))
    installs = [lever for lever in levers if hasattr(lever, "install")]
    shared = next((s for s in sharding.values() if s is not None), None)
    if shared is not None:
        installs.append(shared)
    if calls.outer or calls.inner:
        installs.append(calls)
    if builds.rewrites:
        installs.append(builds)
    return levers, installs


def _sharding_levers(names: Sequence[str], levers: list[Any]) -> dict[str, Any]:
    """The distributed levers among ``names`` (``levers.sharding``), added to ``levers``;
    name -> the shared FSDP2 patches (None for ``zero``, which installs itself)."""
    from .catalog import SHARDING_LEVERS

    if not any(name in SHARDING_LEVERS for name in names):
        return {}
    from .sharding import Sharding, ShardingLever, ZeroLever

    shared, out = Sharding(), {}
    for name in names:
        if name == "zero":
            levers.append(ZeroLever())
            out[name] = None
        elif name in SHARDING_LEVERS:
            levers.append(ShardingLever(name, shared))
            out[name] = shared
    return out
