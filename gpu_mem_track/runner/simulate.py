"""``run --simulate GPU``: the script runs unchanged on a simulated GPU.

The run is prepared as a CUDA run on ``cuda:0`` (no NVIDIA driver is asked for), and
``execute`` enters :func:`gpu_mem_track.simgpu.simulated_gpu` before the sampler first
reads: ``torch.cuda`` then answers from the GPU model, tensors the script puts on
``cuda`` are simulated (shape, dtype, strides; no data) and allocated from the
caching-allocator model, and the runner's own CUDA path (``samplers.CudaSampler``,
``run --snapshot``'s history recorder, the census on CUDA) reads that model as it would
read a real GPU. What the simulation could not know (value reads that got a
placeholder, data-dependent shapes taken at a bound, saves that wrote nothing, where the
GPU ran out) goes into the run's description (``records.SimulationInfo``).

Long loops stop once memory is steady (``steady``): on by default under ``--simulate``
(``--run-to-end`` turns it off), with ``--max-iterations`` and ``--max-seconds`` for
any run. A stopped loop is left as a ``break`` would, so the script goes on after it
(``--end-script``: the script ends there instead).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..runfolder.records import SimulationInfo
from .steady import StopRule

if TYPE_CHECKING:
    from .options import RunOptions

__all__ = ["check_levers", "check_simulate", "simulation", "simulation_info", "stop_rule"]


def check_simulate(options: RunOptions, rank: Any) -> Any:
    """The ``GpuSpec`` of ``--simulate`` (None without it), with the probe's measurement
    of its non-PyTorch memory when one is saved (``catalog.parse_gpu``); ``UsageError`` for an
    unknown GPU (one line listing the names), a device other than CUDA or a ``--memory``
    choice.
    Under torchrun each rank gets its own simulated GPU (:mod:`~gpu_mem_track.simgpu.ranks`)."""
    if options.simulate is None:
        return None
    from ..simgpu.catalog import parse_gpu

    spec = parse_gpu(options.simulate)
    if options.device not in ("auto", "cuda", "cuda:0"):
        raise UsageError(
            f"--simulate runs the script on a simulated cuda:0; it cannot run on --device {options.device}"
        )
    if options.memory != "auto":
        raise UsageError(f"--memory {options.memory} measures the CPU; --simulate reads the simulated GPU")
    return spec


def check_levers(options: RunOptions, device: Any) -> None:
    """``UsageError`` (one line) for an unknown ``--lever`` (listing the names), one given
    twice, or levers on a run that is not on CUDA (real or simulated): they change how
    a script uses the GPU."""
    from ..levers.catalog import check_levers as check_names

    check_names(options.levers)
    if options.levers and not device.is_cuda:
        raise UsageError(
            "--lever changes how the script uses a CUDA GPU: give --simulate GPU or --device cuda "
            f"(this run would be on {device})"
        )


def stop_rule(options: RunOptions) -> StopRule | None:
    """The stop rule of the run (None when nothing can stop it early): steady memory
    under ``--simulate`` unless ``--run-to-end``, and the budgets; a stopped loop is left
    unless ``--end-script``."""
    rule = StopRule(
        until_steady=options.simulate is not None and not options.run_to_end,
        max_iterations=options.max_iterations,
        max_seconds=options.max_seconds,
        leave_loop=not options.end_script,
    )
    return rule if rule.active else None


@contextlib.contextmanager
def simulation(spec: Any, rank: Any = None) -> Iterator[Any]:
    """The simulated GPU of ``spec`` while the block runs (None for no spec: a real run);
    with ``rank`` (a torchrun launch) that rank's GPU, its process group a fake one."""
    if spec is None:
        yield None
        return
    from ..simgpu import simulated_gpu
    from ..simgpu.ranks import RankEnv

    with simulated_gpu(spec, ranks=RankEnv.from_environ() if rank is not None else None) as gpu:
        yield gpu


def simulation_info(gpu: Any) -> SimulationInfo:
    """What the simulated GPU recorded, as the run's description holds it."""
    oom = gpu.out_of_memory
    return SimulationInfo(
        gpu=gpu.spec.to_dict(),
        placeholders=tuple(record.to_dict() for record in gpu.placeholders),
        bounds=tuple(record.to_dict() for record in gpu.bounds),
        skipped_saves=int(gpu.skipped_saves),
        compiled=tuple(record.to_dict() for record in gpu.compiled),
        out_of_memory=None if oom is None else oom.to_dict(),
    )
