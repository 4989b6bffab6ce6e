"""Element-wise numpy work over a large array in blocks, on threads.

numpy's element-wise loops release the GIL, so blocks of a model's weights (a billion values or more) convert on
every core side by side; each block is a few passes over about a megavalue, small enough to stay in cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

BLOCK_VALUES = 1 << 20


def row_blocks(rows: int, cols: int) -> list[slice]:
    """Row ranges of about BLOCK_VALUES values each, for an array of ``rows`` rows of ``cols`` values."""
    step = max(1, BLOCK_VALUES // max(cols, 1))
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def each_block(rows: int, cols: int, work: Callable[[slice], None]) -> None:
    """``work(block)`` for each row range ``block`` of row_blocks(rows, cols), on a thread pool when there is more
    than one; the first error a block raises (in row order) is raised here."""
    blocks = row_blocks(rows, cols)
    if len(blocks) <= 1:
        for block in blocks:
            work(block)
        return
    with ThreadPoolExecutor(max_workers=min(len(blocks), os.cpu_count() or 1)) as pool:
        for future in [pool.submit(work, block) for block in blocks]:
            future.result()
