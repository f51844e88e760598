"""The one Markdown table builder: a header row, an alignment row, and the body rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _row(cells: Sequence[object]) -> str:
    return "|" + "|".join(f" {cell} " if str(cell) else " " for cell in cells) + "|"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], numeric_from: int = 1) -> list[str]:
    """The lines of a Markdown table. Columns from index `numeric_from` on are right-aligned (numbers), the ones
    before it left-aligned (labels); an empty cell renders as a single space."""
    rule = "|" + "".join("---:|" if k >= numeric_from else "---|" for k in range(len(header)))
    return [_row(header), rule, *(_row(cells) for cells in rows)]
