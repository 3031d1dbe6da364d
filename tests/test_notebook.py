"""Notebooks: ``%load_ext gpu_mem_track``, ``%memtrack`` and ``%%memtrack`` in a real IPython
shell, on the CPU and on a (simulated) GPU, and one notebook run through a real kernel."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.lib.pretty import pretty  # noqa: E402

from gpu_mem_track.errors import UsageError  # noqa: E402
from gpu_mem_track.notebook.magics import parse_cell_options  # noqa: E402
from gpu_mem_track.notebook.measure import CellOptions, measure_statement, profile_cell, rise  # noqa: E402
from gpu_mem_track.notebook.records import CellProfile, StatementMemory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


@pytest.fixture
def shell():
    """The IPython shell with the extension loaded and a small CPU model in its namespace."""
    ip = InteractiveShell.instance()
    if "gpu_mem_track" not in ip.extension_manager.loaded:
        ip.run_line_magic("load_ext", "gpu_mem_track")
    ip.user_ns.update(torch=torch, model=torch.nn.Linear(64, 32), x=torch.randn(16, 64))
    yield ip
    for name in ("model", "x", "y", "a", "b", "big", "h"):
        ip.user_ns.pop(name, None)


def test_memtrack_names_the_tensor_a_statement_created_and_its_bytes(shell):
    result = shell.run_line_magic("memtrack", "-o y = model(x)")
    assert isinstance(result, StatementMemory) and result.device == "cpu" and result.source == "tensors"
    assert result.increment == 16 * 32 * 4  # the census's bytes: exactly y
    (created,) = result.changes
    assert (created.kind, created.shape, created.names, created.bytes_delta) == (
        "Tensor",
        (16, 32),
        ("y",),
        2048,
    )
    assert result.peak_source == "process RSS" and result.peak >= result.peak_before
    assert result.rss_before is not None and result.rss_after is not None
    assert tuple(shell.user_ns["y"].shape) == (16, 32)  # ran in the user's namespace
    assert pretty(result).startswith("%memtrack on cpu: tensors +2.00 KiB")
    html = result._repr_html_()
    assert "%memtrack y = model(x)" in html and "16x32" in html and ">y<" in html


def test_memtrack_sees_a_freed_tensor(shell):
    shell.run_cell("a = torch.zeros(256, 1024)")
    result = shell.run_line_magic("memtrack", "-o del a")
    assert result.increment == -MIB
    assert [(c.names, c.bytes_delta) for c in result.changes] == [(("a",), -MIB)]


def test_memtrack_shows_its_result_wherever_it_stands_and_returns_it_with_o(shell, capsys):
    shell.run_cell("%memtrack y = model(x)\nafter = 1")  # not the cell's last line
    out = capsys.readouterr().out
    assert out.startswith("%memtrack on cpu: tensors +2.00 KiB") and "Out[" not in out
    assert shell.run_line_magic("memtrack", "z = y * 2") is None  # shown, not returned twice
    assert capsys.readouterr().out.startswith("%memtrack on cpu: tensors +2.00 KiB")
    kept = shell.run_line_magic("memtrack", "--device cpu -o w = y + 1")
    assert isinstance(kept, StatementMemory) and kept.statement == "w = y + 1"
    assert capsys.readouterr().out.startswith("%memtrack on cpu: tensors +2.00 KiB")
    shell.run_cell("r = %memtrack -o v = -y")
    assert shell.user_ns["r"].increment == 16 * 32 * 4 and tuple(shell.user_ns["v"].shape) == (16, 32)
    for name in ("after", "z", "w", "r", "v"):
        shell.user_ns.pop(name, None)


def test_memtrack_mistakes_print_one_line_and_return_nothing(shell, capsys):
    assert shell.run_line_magic("memtrack", "") is None
    assert (
        capsys.readouterr().err == "gpu_mem_track: %memtrack needs a statement, e.g. %memtrack y = model(x)\n"
    )
    if not torch.cuda.is_available():  # not a silent "cuda allocator: 0 B"
        assert shell.run_line_magic("memtrack", "--device cuda:0 b = 1") is None
        assert shell.run_cell_magic("memtrack", "--device cuda:0", "b = 1") is None
        assert capsys.readouterr().err == 2 * "gpu_mem_track: --device cuda:0: CUDA is not available here\n"
    assert shell.run_line_magic("memtrack", "--bogus b = 1") is None  # not our SyntaxError traceback
    assert capsys.readouterr().err == (
        "gpu_mem_track: %memtrack: unknown option '--bogus' "
        "(usage: %memtrack [-o] [--device DEV] STATEMENT)\n"
    )
    assert shell.run_cell_magic("memtrack", "--top x", "b = 1") is None
    assert capsys.readouterr().err == "gpu_mem_track: %%memtrack: argument --top: invalid int value: 'x'\n"
    assert shell.run_cell_magic("memtrack", "--census-threshold lots", "b = 1") is None
    assert "--census-threshold: not a byte size: 'lots'" in capsys.readouterr().err


def test_cell_memtrack_profiles_each_line_and_takes_censuses(shell, fresh_heap):
    cell = "h = model(x)\nbig = torch.ones(4096, 4096)\nb = [torch.ones(10) for _ in range(2)]\ndel big\n"
    profile = shell.run_cell_magic("memtrack", "--census-threshold 1 --top 2", cell)
    assert isinstance(profile, CellProfile) and profile.source == "process RSS" and profile.top == 2
    cell_lines = sorted((r.line, r.code) for r in profile.lines if r.function == "<module>")
    assert cell_lines == [
        (1, "h = model(x)"),
        (2, "big = torch.ones(4096, 4096)"),
        (3, cell.splitlines()[2]),
        (4, "del big"),
    ]
    if sys.version_info < (3, 12):  # 3.12 inlines comprehensions (PEP 709): no frame of their own
        assert any(r.function.endswith("<listcomp>") for r in profile.lines)  # the comprehension's frame too
    # Every census is at the cell line that grew; line 2 touches 64 MiB of new pages.
    assert all(s.file == profile.filename for s in profile.censuses)
    (after_big,) = [s for s in profile.censuses if s.line == 2]
    assert [(c.names, c.bytes_delta) for c in after_big.changes if c.shape == (4096, 4096)] == [
        (("big",), 64 * MIB)
    ]
    assert "big" not in shell.user_ns  # the cell ran in the user's namespace, del included
    text = pretty(profile)
    assert (
        text.startswith("%%memtrack on cpu (process RSS): peak ") and "big = torch.ones(4096, 4096)" in text
    )
    assert "big = torch.ones(4096, 4096)" in profile._repr_html_()


def test_cell_options_are_runs_census_options():
    assert parse_cell_options("--census-threshold 64MiB --activations --top 3 --device cpu") == CellOptions(
        64 * MIB, True, 3, "cpu"
    )
    assert parse_cell_options("") == CellOptions()
    with pytest.raises(UsageError, match="--top: not a count"):
        parse_cell_options("--top -1")


def test_a_cell_error_propagates_with_the_engine_removed():
    with pytest.raises(ZeroDivisionError):
        profile_cell("a = 1\nb = a / 0\n", {}, CellOptions())


def test_the_first_cell_census_lists_only_what_the_cell_created(shell, fresh_heap):
    shell.user_ns["old"] = torch.zeros(512, 1024)  # made before the cell: not the cell's
    profile = shell.run_cell_magic("memtrack", "--census-threshold 1", "big = torch.ones(4096, 4096)\n")
    shell.user_ns.pop("old")
    first = profile.censuses[0]
    assert [(c.names, c.bytes_delta) for c in first.changes] == [(("big",), 64 * MIB)]


@pytest.mark.parametrize("magic", ["%%memtrack\na = 1\nb = a / 0\n", "%memtrack b = 1 / 0"])
def test_an_error_in_the_users_code_shows_no_frame_of_ours(shell, capsys, magic):
    shell.run_line_magic("xmode", "Context")
    capsys.readouterr()
    result = shell.run_cell(magic)
    assert isinstance(result.error_in_exec, ZeroDivisionError)  # still the cell's error
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert "ZeroDivisionError: division by zero" in shown and "<memtrack" in shown
    assert "magics.py" not in shown and "measure.py" not in shown, shown


def test_the_peak_compares_high_water_marks_and_never_resets_them(gpu):
    assert rise(10, 50, 20, 80) == (80, True)  # the mark rose: exact
    assert rise(10, 90, 20, 90) == (20, False)  # it did not: at least the larger reading
    namespace = {"torch": torch}
    exec("keep = torch.empty(100 * 2**20, dtype=torch.uint8, device='cuda')", namespace)
    statement = (
        "y = torch.empty(300 * 2**20, dtype=torch.uint8, device='cuda'); del y\n"
        "z = torch.empty(50 * 2**20, dtype=torch.uint8, device='cuda')"
    )
    result = measure_statement(statement, namespace, "cuda:0", text="step()")
    assert (result.source, result.peak_source) == ("cuda allocator", "cuda allocator")
    assert (result.before, result.after, result.increment) == (100 * MIB, 150 * MIB, 50 * MIB)
    assert (result.peak, result.peak_exact) == (400 * MIB, True)
    assert [(c.names, c.bytes_delta) for c in result.changes] == [(("z",), 50 * MIB)]
    again = measure_statement("w = torch.empty(MIB, device='cuda')", {**namespace, "MIB": MIB}, "cuda:0")
    assert (again.peak, again.peak_exact) == (154 * MIB, False)  # below the mark: a lower bound
    assert torch.cuda.max_memory_allocated() == 400 * MIB  # untouched: the user's counters stay
    assert StatementMemory.from_dict(result.to_dict()) == result


def test_memtrack_on_cuda_measures_the_allocator(shell, gpu):
    shell.user_ns.update(model=torch.nn.Linear(64, 32).cuda(), x=torch.randn(16, 64, device="cuda"))
    base = torch.cuda.memory_allocated()
    result = shell.run_line_magic("memtrack", "-o --device cuda:0 y = model(x)")
    assert (result.device, result.source) == ("cuda:0", "cuda allocator")
    assert result.before == base and result.after == torch.cuda.memory_allocated()
    (created,) = result.changes
    assert (created.shape, created.names, created.bytes_delta) == ((16, 32), ("y",), 2048)
    assert shell.user_ns["y"].is_cuda
    cell = "h = model(x)\nbig = torch.ones(4096, 4096, device='cuda')\ndel big\n"
    profile = shell.run_cell_magic("memtrack", "--device cuda:0 --census-threshold 1", cell)
    assert profile.source == "cuda allocator"
    rows = {r.line: r for r in profile.lines if r.function == "<module>"}
    assert (rows[2].increment, rows[3].increment) == (64 * MIB, -64 * MIB)
    (at_big,) = [s for s in profile.censuses if s.line == 2]
    assert [(c.names, c.bytes_delta) for c in at_big.changes] == [(("big",), 64 * MIB)]
    assert pretty(profile).startswith("%%memtrack on cuda:0 (cuda allocator): peak ")


# -- a real kernel -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_notebook_runs_the_magics_through_a_real_kernel(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    cells = [
        "%load_ext gpu_mem_track",
        "import torch\nfrom gpu_mem_track import MemTracker\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))\n"
        "x = torch.randn(32, 64)",
        "%memtrack hidden = model[0](x)\nafter = 1",
        "%%memtrack --census-threshold 1 --top 3\nout = model(x)\nbig = torch.ones(2048, 1024)\n"
        "loss = out.sum()\nloss.backward()",
        "tracker = MemTracker(device='cpu', out_dir=None, verbosity=0, probe=False)\n"
        "tracker.watch(model=model)\ntracker.track('after backward')",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [cell.outputs for cell in notebook.cells]
    assert not [o for cell in outputs for o in cell if o.output_type == "error"]
    (statement,) = [o.data for o in outputs[2] if o.output_type == "display_data"]
    lines, stamp = (_result(outputs[i]) for i in (3, 4))
    assert statement["text/plain"].startswith("%memtrack on cpu: tensors +16.00 KiB")
    assert "%memtrack hidden = model[0](x)" in statement["text/html"] and ">hidden<" in statement["text/html"]
    assert "32x128" in statement["text/html"]
    assert "loss.backward()" in lines["text/html"] and "out = model(x)" in lines["text/plain"]
    # the census after line 2 (8 MiB of new pages) names the tensor, in text and in HTML
    assert re.search(
        r"Size:\(2048, 1024\) \| Memory: 8\.00 MiB \| Tensor *\| float32 *\| big\n", lines["text/plain"]
    )
    assert "2048x1024" in lines["text/html"] and "[line 2 grew " in lines["text/html"]
    assert "[after backward]" in stamp["text/html"] and "Gradient" in stamp["text/html"]


def _result(outputs: list) -> dict:
    (result,) = [o for o in outputs if o.output_type == "execute_result"]
    return result.data
