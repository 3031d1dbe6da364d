"""The IPython magics ``%memtrack`` (one statement) and ``%%memtrack`` (a cell, line by
line). ``%memtrack`` shows its record wherever it stands in a cell, as ``%timeit`` does
(IPython's ``display``: an HTML table in Jupyter, text in a terminal), and returns it
only with ``-o``; ``%%memtrack`` returns its record, shown as the cell's result. A usage
mistake prints one line (``gpu_mem_track: ...``) and returns None.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from ..devices import parse_device
from ..errors import UsageError
from ..units import parse_bytes
from .measure import CellOptions, default_device, measure_statement, profile_cell

__all__ = ["MemtrackMagics", "parse_cell_options"]

USAGE = """%memtrack [-o] [--device DEV] STATEMENT
    What STATEMENT allocated (CUDA allocated bytes on a GPU; on the CPU the live tensors'
    bytes, with the process RSS), its peak, and the tensor groups it created or freed,
    shown where the magic stands; -o also returns it (r = %memtrack -o ...).
%%memtrack [--census-threshold SIZE] [--activations] [--top N] [--device DEV] [--simulate GPU]
    The cell line by line: memory after each line, increment, peak, hits (the runner's
    engine); options as for `python -m gpu_mem_track run`. --simulate GPU runs the cell on a
    simulated GPU (a name of `gpu-mem-track gpus`, or SIZE:smXY) for the cell's duration."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the kernel
        raise UsageError(f"%%memtrack: {message}")


def _cell_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%%memtrack", add_help=False)
    parser.add_argument("--census-threshold", metavar="SIZE")
    parser.add_argument("--activations", action="store_true")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--device")
    parser.add_argument("--simulate", metavar="GPU")
    return parser


def parse_cell_options(line: str) -> CellOptions:
    """``%%memtrack``'s options from its line; ``UsageError`` naming a bad one."""
    args = _cell_parser().parse_args(shlex.split(line))
    try:
        threshold = None if args.census_threshold is None else parse_bytes(args.census_threshold)
    except ValueError as exc:
        raise UsageError(f"%%memtrack --census-threshold: {exc}") from None
    if args.top < 0:
        raise UsageError(f"%%memtrack --top: not a count >= 0: {args.top}")
    if args.simulate is None:
        return CellOptions(threshold, args.activations, args.top, _device(args.device))
    from ..simgpu.catalog import parse_gpu

    spec = parse_gpu(args.simulate)
    if args.device not in (None, "cuda", "cuda:0"):
        raise UsageError(f"%%memtrack --simulate runs the cell on a simulated cuda:0, not on {args.device}")
    return CellOptions(threshold, args.activations, args.top, "cuda:0", spec)


def _device(text: str | None) -> str | None:
    """The ``--device`` given, parsed; ``UsageError`` for CUDA where it is not available
    (the allocator would read 0 B)."""
    if text is None:
        return None
    device = parse_device(text)
    if device.is_cuda:
        import torch  # the notebook has imported it already; this starts no CUDA context

        if not torch.cuda.is_available():
            raise UsageError(f"--device {text}: CUDA is not available here")
    return str(device)


def _statement(line: str) -> tuple[bool, str | None, str]:
    """The options in front of the statement (``-o``; ``--device DEV`` or
    ``--device=DEV``, in any order) and the statement: ``(return it, device, statement)``."""
    rest, keep, device = line.strip(), False, None
    while True:
        if rest == "-o" or rest.startswith(("-o ", "-o\t")):
            keep, rest = True, rest[2:].lstrip()
            continue
        prefix = next((p for p in ("--device=", "--device ") if rest.startswith(p)), None)
        if prefix is None:
            return keep, device, rest
        text, _, rest = rest[len(prefix) :].lstrip().partition(" ")
        device, rest = _device(text), rest.strip()


@magics_class
class MemtrackMagics(Magics):
    """``%memtrack`` and ``%%memtrack``; see ``USAGE``."""

    @line_cell_magic
    def memtrack(self, line: str, cell: str | None = None) -> Any:
        # IPython leaves frames with this local out of a traceback: an exception from the
        # user's code shows the user's frames, not ours (as ``run`` does).
        __tracebackhide__ = True
        try:  # the docstring (``%memtrack?``) is USAGE, set below
            if cell is None:
                return self._statement(line)
            return profile_cell(cell, self.shell.user_ns, parse_cell_options(line))
        except UsageError as exc:
            print(f"gpu_mem_track: {exc}", file=sys.stderr)
            return None

    memtrack.__doc__ = USAGE

    def _statement(self, line: str) -> Any:
        __tracebackhide__ = True  # see memtrack
        keep, device, statement = _statement(line)
        if not statement:
            raise UsageError("%memtrack needs a statement, e.g. %memtrack y = model(x)")
        try:
            code = self.shell.compile(self.shell.transform_cell(statement), "<memtrack>", "exec")
        except SyntaxError:
            if not statement.startswith("-"):  # ``-x`` is a statement, ``--bogus x`` is not
                raise
            option = statement.split()[0]
            raise UsageError(
                f"%memtrack: unknown option {option!r} (usage: %memtrack [-o] [--device DEV] STATEMENT)"
            ) from None
        result = measure_statement(code, self.shell.user_ns, device or default_device(), text=statement)
        display(result)
        return result if keep else None
