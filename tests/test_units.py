from __future__ import annotations

import pytest

from gpu_mem_track.units import cuda_block_bytes, format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (0, "0 B"),
        (24, "24 B"),  # the classic tool printed 3 x (1,) int64 as "2.2888 M"
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1535, "1.50 KiB"),
        (1536, "1.50 KiB"),
        (574_668_960, "548.05 MiB"),
        (411_041_792, "392.00 MiB"),
        (2**30 - 1, "1.00 GiB"),  # rounds up to 1024.00 MiB, so it moves to the next unit
        (-4 * 2**20, "-4.00 MiB"),
        (None, "n/a"),
    ],
)
def test_format_bytes(nbytes, text):
    assert format_bytes(nbytes) == text


def test_format_bytes_rounds_rather_than_truncates():
    assert format_bytes(int(1.999 * 2**20)) == "2.00 MiB"
    assert format_bytes(5 * 2**20, signed=True) == "+5.00 MiB"


@pytest.mark.parametrize(
    ("nbytes", "block"), [(0, 0), (1, 512), (4, 512), (512, 512), (513, 1024), (4 * 2**20, 4 * 2**20)]
)
def test_cuda_block_bytes(nbytes, block):
    assert cuda_block_bytes(nbytes) == block


def test_parse_bytes():
    assert parse_bytes("64MiB") == 64 * 2**20
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("512") == 512
    assert parse_bytes(format_bytes(3 * 2**50)) == 3 * 2**50  # what reports print reads back
    assert parse_bytes("2PB") == 2 * 10**15
    with pytest.raises(ValueError, match="not a byte size: '12 parsecs'"):
        parse_bytes("12 parsecs")
