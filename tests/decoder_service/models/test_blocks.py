from __future__ import annotations

import threading

import pytest

from decoder_service.models.blocks import BLOCK_VALUES, each_block, row_blocks


@pytest.mark.parametrize(("rows", "cols"), [(0, 8), (1, 1), (5, BLOCK_VALUES), (1000, 4096), (3, 2 * BLOCK_VALUES)])
def test_row_blocks_cover_every_row_once_in_order(rows: int, cols: int) -> None:
    blocks = row_blocks(rows, cols)
    covered = [row for block in blocks for row in range(block.start, block.stop)]
    assert covered == list(range(rows))
    assert all((block.stop - block.start) * cols <= max(BLOCK_VALUES, cols) for block in blocks)


def test_each_block_runs_every_block_and_raises_the_first_error() -> None:
    seen: list[slice] = []
    lock = threading.Lock()

    def record(block: slice) -> None:
        with lock:
            seen.append(block)

    each_block(1000, 4096, record)
    assert sorted(seen, key=lambda b: b.start) == row_blocks(1000, 4096)

    def fail(block: slice) -> None:
        if block.start >= 256:
            raise ValueError(f"row {block.start}")

    with pytest.raises(ValueError, match="row 256"):
        each_block(1000, 4096, fail)
