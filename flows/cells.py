"""A flow's cell: its database URL, read from the cells file (outbox.cells) on the worker.

cell name ─▶ OUTBOX_CELLS_FILE read and checked whole ─▶ each cell whose URL variable is unset on the
             worker: its Prefect Secret block `outbox-cell-<name>`, offered as a URL source
          ─▶ the cell's URL, or CellsError naming the file, the cell and every place asked
"""

from __future__ import annotations

import contextlib
import os
from typing import cast

from prefect.blocks.system import Secret

from outbox.cells import Cells, CellsError, add_url_source, cells_file, load_cells

# the Prefect Secret block a cell's database URL is read from when the variable the cells file names is unset
CELL_URL_BLOCK = "outbox-cell-{name}"


async def cell_urls_from_prefect(cells: Cells) -> None:
    """Read the Secret block `outbox-cell-<name>` of each cell whose URL variable is unset, and offer them as a
    URL source (outbox.cells.add_url_source). A cell with no block either is named when its URL is read."""
    found: dict[str, str] = {}
    for cell in cells:
        if cell.source != "database_url_variable" or os.environ.get(cell.value, "").strip():
            continue
        with contextlib.suppress(ValueError):  # no such block: the cells' error names it
            block = cast("Secret[str]", await Secret.aload(CELL_URL_BLOCK.format(name=cell.name)))
            found[cell.name] = str(block.get())
    add_url_source(found.get, label=lambda name: "the Prefect Secret block " + CELL_URL_BLOCK.format(name=name))


async def cell_url(cell: str) -> str:
    """Cell `cell`'s database URL: the cells file read and checked, its Secret blocks asked for the cells
    whose variable is unset; CellsError naming the file and the cell."""
    if cells_file() is None:
        raise CellsError(f"a run of cell {cell} needs the cells file: set OUTBOX_CELLS_FILE on the worker")
    cells = load_cells()
    cells.cell(cell)
    await cell_urls_from_prefect(cells)
    return cells.url(cell)
