"""The guarded CSV reading (``csvrows``): ``csv``'s own quoting rules, a stray quote
named by its line instead of swallowing the rows after it, bounded cells that what we
write reads back, a byte-order mark, strict ASCII integers (issue 16, items 6, 9, 19)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from runfiles import MIB, tracker_csv

from gpu_mem_track.csvrows import FIELD_LIMIT, CompleteRows, LinedRows, cell_text
from gpu_mem_track.errors import BadInput
from gpu_mem_track.runfolder.files import LINE_REQUIRED, read_lines
from gpu_mem_track.tracker.csvlog import read_stamps


def rows(text: str) -> tuple[list[str], CompleteRows]:
    complete = CompleteRows(io.StringIO(text, newline=""), "t.csv")
    return list(complete), complete


def test_a_quote_inside_a_cell_is_text_as_csv_reads_it_and_later_rows_stay() -> None:
    text = 'a,b,c\n1,x"y,2\n3,4,5\n6,7,8\n'
    got, complete = rows(text)
    assert got == ["a,b,c\n", '1,x"y,2\n', "3,4,5\n", "6,7,8\n"]
    assert complete.cut == ""


def test_a_quote_opening_a_cell_that_never_closes_is_named_by_its_line() -> None:
    text = 'a,b,c\n1,2,3\n4,"5,6\n7,8,9\n10,11,12\n'
    with pytest.raises(
        BadInput, match=r"^t.csv, line 3: not a valid report row \(a quoted cell opens here and"
    ):
        rows(text)


def test_a_cut_multi_line_cell_at_the_end_is_still_a_cut_row() -> None:
    got, complete = rows('a,b\n1,2\n3,"open\ncell')
    assert got == ["a,b\n", "1,2\n"] and complete.cut_line == 3


def test_a_row_with_more_cells_than_the_header_is_named() -> None:
    with pytest.raises(
        BadInput, match=r"^t.csv, line 3: not a valid report row \(4 cells where the header has 3\)"
    ):
        rows("a,b,c\n1,2,3\n1,2,3,4\n")


def test_a_stray_quote_in_a_tracker_csv_label_keeps_every_later_stamp(tmp_path: Path) -> None:
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB), ("b", 1.0, 2 * MIB), ("c", 2.0, 3 * MIB)])
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace(",b,", ',b"x,', 1)  # one raw quote inside the label cell
    path.write_text("".join(lines))
    notes: list[str] = []
    assert [s.label for s in read_stamps(path, notes)] == ["a", 'b"x', "c"]
    assert notes == []


def test_a_stray_quote_opening_a_cell_names_its_line_not_a_cut_last_row(tmp_path, in_process) -> None:
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB), ("b", 1.0, 2 * MIB), ("c", 2.0, 3 * MIB)])
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace(",b,", ',"b,', 1)
    path.write_text("".join(lines))
    done = in_process("show", path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{path}, line 3: not a valid report row (a quoted cell opens here and never closes" in done.stderr
    assert "incomplete" not in done.stderr


def test_cells_over_the_csv_default_limit_round_trip(tmp_path: Path) -> None:
    label = "L" * (200 * 1024)  # over csv's default 128 KiB field limit
    path = tracker_csv(tmp_path / "t.csv", [(label, 0.0, MIB)])
    assert [s.label for s in read_stamps(path)] == [label]


def test_cell_text_bounds_what_is_written_to_what_is_read() -> None:
    assert cell_text("x" * FIELD_LIMIT) == "x" * FIELD_LIMIT
    cut = cell_text("x" * (FIELD_LIMIT + 1))
    assert len(cut) == FIELD_LIMIT and cut.endswith(" [...]")


def test_a_tracker_csv_with_a_byte_order_mark_reads(tmp_path: Path, in_process) -> None:
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB), ("b", 1.0, 2 * MIB)])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert [s.label for s in read_stamps(path)] == ["a", "b"]
    done = in_process("show", path)
    assert done.returncode == 0, done.stderr
    assert "a" in done.stdout


@pytest.mark.parametrize("number", ["1_0", "\u0661\u0662", "1e3", "+ 5"])
def test_integers_are_ascii_digits_only(tmp_path: Path, number: str) -> None:
    path = tracker_csv(tmp_path / "t.csv", [("a", 0.0, MIB)])
    header, row = path.read_text(encoding="utf-8").splitlines()
    cells = row.split(",")
    cells[header.split(",").index("seq")] = number
    path.write_text("\n".join([header, ",".join(cells)]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t.csv, line 2: not a valid report row \(not an integer"):
        read_stamps(path)


def test_lined_rows_name_the_line_each_row_starts_on() -> None:
    text = 'a,b\n1,"two\nlines"\n\n3,4\n5\n'
    reader = LinedRows(io.StringIO(text, newline=""))
    got = [(reader.line, row) for row in reader]
    assert reader.fieldnames == ["a", "b"]
    assert got == [(2, {"a": "1", "b": "two\nlines"}), (5, {"a": "3", "b": "4"}), (6, {"a": "5", "b": None})]


def test_a_damaged_tracker_row_after_a_multi_line_label_is_named_by_its_own_line(tmp_path: Path) -> None:
    stamps = [("two\nlines", 0.0, MIB), ("b", 1.0, 2 * MIB), ("c", 2.0, 3 * MIB), ("d", 3.0, 4 * MIB)]
    path = tracker_csv(tmp_path / "t.csv", stamps)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines[3].split(",")[6] == "b"  # header, the label's two lines, then b's row: line 4
    lines[3] = lines[3].replace(str(2 * MIB), "12x", 1)  # its allocated bytes
    path.write_text("".join(lines), encoding="utf-8")
    expected = r"^\S*t.csv, line 4: not a valid report row \(not an integer: '12x'\)$"
    with pytest.raises(BadInput, match=expected):
        read_stamps(path)


def test_a_damaged_run_folder_row_is_named_by_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "lines.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(LINE_REQUIRED)
        writer.writerow(["/src/t.py", "main", 3, "s = '''a\nb'''", 1, MIB, MIB, MIB, "True", 0.5])
        handle.write("\r\n")  # a blank line, as a hand edit leaves
        writer.writerow(["/src/t.py", "main", 5, "x = 1", 1, MIB, 0, "12x", "True", 0.5])
    with pytest.raises(BadInput, match=r"^\S*lines.csv, line 5: not an integer: '12x'$"):
        read_lines(path)
