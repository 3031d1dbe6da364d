"""Text for estimates and batch-size results; renderers return strings and never print."""

from __future__ import annotations

from tabulate import tabulate

from ..units import format_bytes
from .records import BatchProbe, BatchSizeResult, Estimate, ValueRead

__all__ = ["render_batch_size", "render_estimate"]


def render_estimate(estimate: Estimate) -> str:
    """The textbook table (per layer: parameters and activations, elements and bytes), then
    the totals, the peak with its phase and what is live at the peak."""
    rows = [
        [
            layer.name or "(model)",
            layer.type,
            f"{layer.parameters:,}",
            format_bytes(layer.parameter_bytes),
            f"{layer.activation_elements:,}",
            format_bytes(layer.activation_bytes),
        ]
        for layer in estimate.layers
    ]
    rows.append(
        [
            "total",
            "",
            f"{estimate.parameters:,}",
            format_bytes(estimate.parameter_bytes),
            f"{estimate.activation_elements:,}",
            format_bytes(estimate.activation_bytes),
        ]
    )
    headers = ["layer", "type", "parameters", "param bytes", "activations", "activation bytes"]
    table = tabulate(
        rows,
        headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left", "left", "right", "right", "right", "right"),
    )
    return "\n".join([_title(estimate), "", table, "", *_totals(estimate), *_value_reads(estimate), ""])


def _title(estimate: Estimate) -> str:
    kind = "training step" if estimate.training else "inference (forward under no_grad)"
    if estimate.step:
        kind = f"step {estimate.step}"
    optimizer = f", optimizer {estimate.optimizer}" if estimate.training else ""
    amp = ", autocast (simulated)" if estimate.amp else ""
    loss = f", loss {estimate.loss}" if estimate.training and estimate.loss != "default" else ""
    ranks = ""
    if estimate.ranks:
        ranks = f" (rank {estimate.rank} of {estimate.world_size}, {estimate.strategy}: the highest peak)"
    elif estimate.strategy not in ("none", ""):
        plural = "s" if estimate.world_size != 1 else ""
        ranks = f" ({estimate.strategy} on {estimate.world_size} rank{plural})"
    return (
        f"Estimated {kind} of {estimate.model} on {estimate.device}{ranks}: "
        f"inputs {', '.join(estimate.inputs)}, dtype {estimate.dtype}{optimizer}{loss}{amp}; "
        f"rounding: {estimate.rounding}"
    )


def _value_reads(estimate: Estimate) -> list[str]:
    """What the model's code read from data-less meta tensors, and which reads got placeholders."""

    def read(r: ValueRead) -> str:
        where = f" in {r.module}" if r.module else ""
        times = f" x{r.count}" if r.count > 1 else ""
        return f"{r.op}{times}{where}" + (f" returned {r.placeholder}" if r.placeholder else "")

    real = [read(r) for r in estimate.value_reads if not r.placeholder]
    fake = [read(r) for r in estimate.value_reads if r.placeholder]
    lines = []
    if real:
        lines.append(f"values read by the model: {', '.join(real)} (computed for real on the CPU)")
    if fake:
        lines.append(
            f"placeholders (values unknown without data; the model ran on these instead): {', '.join(fake)}"
        )
    return lines


def _totals(estimate: Estimate) -> list[str]:
    top = estimate.largest_activation_layer
    held = f"; most held by {top.name or '(model)'}: {format_bytes(top.activation_bytes)}" if top else ""
    host = f"; step counters on the host: {format_bytes(estimate.host_bytes)}" if estimate.host_bytes else ""
    states = f"{estimate.optimizer_states} tensors{host}"
    lines = [
        f"parameters        {format_bytes(estimate.parameter_bytes):>12}  ({estimate.parameters:,} elements)",
        f"buffers           {format_bytes(estimate.buffer_bytes):>12}",
        f"gradients         {format_bytes(estimate.gradient_bytes):>12}",
        f"optimizer states  {format_bytes(estimate.optimizer_state_bytes):>12}  ({states})",
        f"inputs            {format_bytes(estimate.input_bytes):>12}",
        f"activations       {format_bytes(estimate.activation_bytes):>12}  (alive when forward ends{held})",
    ]
    peak = estimate.peak_phase
    where = ", in module ".join(part for part in (peak.op, peak.module) if part)
    lines.append(
        f"peak              {format_bytes(estimate.peak):>12}  during {peak.phase}"
        + (f" ({where})" if where else "")
    )
    split = " + ".join(
        f"{label} {format_bytes(nbytes)}" for label, nbytes in estimate.at_peak.by_label().items() if nbytes
    )
    workspace = estimate.cublas_workspace
    workspace = f" + cuBLAS workspace {format_bytes(workspace)}" if workspace else ""
    lines.append(f"  at the peak: {split}{workspace}")
    lines.append("  phase peaks: " + ", ".join(f"{p.phase} {format_bytes(p.peak)}" for p in estimate.phases))
    if estimate.ranks:
        lines.append(
            "per rank: " + ", ".join(f"{r.rank}: {format_bytes(r.peak)} ({r.phase})" for r in estimate.ranks)
        )
    return lines + _allocator_lines(estimate)


def _allocator_lines(estimate: Estimate) -> list[str]:
    """Reserved memory, the cache at the peak and the cuBLAS workspaces (CUDA target)."""
    if estimate.reserved_peak is None:
        return []
    return [
        f"reserved peak     {format_bytes(estimate.reserved_peak):>12}  "
        f"(caching allocator segments; settings: {estimate.allocator or 'defaults'})",
        f"  at the peak: reserved {format_bytes(estimate.reserved_at_peak)}, "
        f"fragmentation (reserved - allocated) {format_bytes(estimate.fragmentation)}, "
        f"largest free block {format_bytes(estimate.largest_free_block)}",
        f"cuBLAS workspace  {format_bytes(estimate.cublas_workspace):>12}  "
        "(one per handle: forward and backward; in allocated, never freed)",
    ]


def render_batch_size(result: BatchSizeResult) -> str:
    """The answer, the margin, the fitted line and every probe.

    Probes over the budget show their exact bytes and ``(over budget)``, so one just
    above the budget does not read like the budget itself. When nothing fits there is
    no line to fit: the smallest batch's peak is given instead.
    """
    probes = f"probes ({len(result.probes)}): " + ", ".join(_probe(p, result.budget) for p in result.probes)
    source = f"peaks from: {result.source}; budget from: {result.budget_source}"
    if not result.batch:
        first = result.probes[0]
        peak = (
            f"its step peaks at {_with_bytes(first.peak)}"
            if first.peak is not None
            else "its step did not run (out of memory)"
        )
        answer = f"not even batch {first.batch} fits the {_with_bytes(result.budget)} budget: {peak}"
        return "\n".join([answer, source, probes, ""])
    answer = (
        f"largest batch that fits: {result.batch} (peak {format_bytes(result.peak)} of "
        f"{format_bytes(result.budget)} budget, margin {format_bytes(result.margin)})"
    )
    fit = (
        f"peak(batch) ~ {format_bytes(round(result.intercept))} + {format_bytes(round(result.slope))} x batch"
    )
    return "\n".join([answer, f"fit near the answer: {fit}", source, probes, ""])


def _with_bytes(nbytes: int) -> str:
    """``"1.00 KiB (1,024 B)"``; below 1 KiB the short form is exact already."""
    return format_bytes(nbytes) if nbytes < 1024 else f"{format_bytes(nbytes)} ({nbytes:,} B)"


def _probe(probe: BatchProbe, budget: int) -> str:
    if probe.peak is None:
        return f"{probe.batch}: failed"
    if probe.peak > budget:
        return f"{probe.batch}: {probe.peak:,} B (over budget)"
    return f"{probe.batch}: {format_bytes(probe.peak)}"
