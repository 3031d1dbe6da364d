"""Text for estimates and batch-size results; renderers return strings and never print."""

from __future__ import annotations

from tabulate import tabulate

from ..units import format_bytes
from .records import BatchSizeResult, Estimate

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
    return "\n".join([_title(estimate), "", table, "", *_totals(estimate), ""])


def _title(estimate: Estimate) -> str:
    kind = "training step" if estimate.training else "inference (forward under no_grad)"
    optimizer = f", optimizer {estimate.optimizer}" if estimate.training else ""
    amp = ", autocast (simulated)" if estimate.amp else ""
    ranks = (
        f" (rank {estimate.rank} of {estimate.world_size}, {estimate.strategy}: the highest peak)"
        if estimate.ranks
        else ""
    )
    return (
        f"Estimated {kind} of {estimate.model} on {estimate.device}{ranks}: "
        f"inputs {', '.join(estimate.inputs)}, dtype {estimate.dtype}{optimizer}{amp}; "
        f"rounding: {estimate.rounding}"
    )


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
    lines.append(f"  at the peak: {split}")
    lines.append("  phase peaks: " + ", ".join(f"{p.phase} {format_bytes(p.peak)}" for p in estimate.phases))
    if estimate.ranks:
        lines.append(
            "per rank: " + ", ".join(f"{r.rank}: {format_bytes(r.peak)} ({r.phase})" for r in estimate.ranks)
        )
    return lines


def render_batch_size(result: BatchSizeResult) -> str:
    """The answer, the margin, the fitted line and every probe."""
    fit = (
        f"peak(batch) ~ {format_bytes(round(result.intercept))} + {format_bytes(round(result.slope))} x batch"
    )
    if result.batch:
        answer = (
            f"largest batch that fits: {result.batch} (peak {format_bytes(result.peak)} of "
            f"{format_bytes(result.budget)} budget, margin {format_bytes(result.margin)})"
        )
    else:
        smallest = result.probes[0].batch
        answer = f"no batch fits the {format_bytes(result.budget)} budget (smallest tried: {smallest})"
    probes = ", ".join(
        f"{p.batch}: {format_bytes(p.peak) if p.peak is not None else 'failed'}" for p in result.probes
    )
    return "\n".join(
        [
            answer,
            f"fit near the answer: {fit}",
            f"peaks from: {result.source}; budget from: {result.budget_source}",
            f"probes ({len(result.probes)}): {probes}",
            "",
        ]
    )
