"""Tables that fit the terminal without cutting a number: columns that do not fit side by side go to a second table
under the first (the key columns repeated), text columns wrap, and a number is never shortened to "1,0…"."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

EDGE = 1  # the table's left border
PAD = 3  # a column's padding (1 each side) and its right border
MIN_TEXT = 10  # a wrapping column is given at least this many characters (or its widest cell, if narrower),
MAX_WORD = 24  # and its longest word up to this many, so that words break at spaces


@dataclass(frozen=True)
class Column:
    """One column: its header, how it is justified, and whether its cells may wrap (text) or must stay whole
    (numbers: the default)."""

    header: str
    justify: str = "right"
    wraps: bool = False


def cell_width(cell: str) -> int:
    """Terminal columns a cell takes on one line (markup removed)."""
    return Text.from_markup(cell).cell_len


def _widest(column: Column, cells: Sequence[str]) -> int:
    """A column's width on one line: its widest cell, at least its header's longest word (headers wrap)."""
    widest = max((cell_width(cell) for cell in cells), default=0)
    return max(widest, max((len(word) for word in column.header.split()), default=0), 1)


def _longest_word(cells: Sequence[str]) -> int:
    return max((len(word) for cell in cells for word in Text.from_markup(cell).plain.split()), default=0)


def fitted_tables(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
                  key_columns: int = 1) -> Group:
    """The rows as one table when it fits in `width`, else as tables stacked one under the other, each holding as
    many columns as fit and the first `key_columns` again (the point or trial each row is). A number column is as
    wide as its widest cell; a text column takes what is left (at least MIN_TEXT) and wraps."""
    widest = [_widest(column, [row[i] for row in rows]) for i, column in enumerate(columns)]
    least = [min(wide, max(MIN_TEXT, min(_longest_word([row[i] for row in rows]), MAX_WORD))) if column.wraps
             else wide for i, (wide, column) in enumerate(zip(widest, columns))]
    keys = list(range(min(key_columns, len(columns))))
    key_width = EDGE + sum(least[i] + PAD for i in keys)
    groups: list[list[int]] = []
    current: list[int] = []
    used = key_width
    for index in range(len(keys), len(columns)):
        if current and used + least[index] + PAD > width:
            groups.append(current)
            current, used = [], key_width
        current.append(index)
        used += least[index] + PAD
    groups.append(current)
    tables = []
    for number, group in enumerate(groups):
        shown = keys + group
        given = {index: least[index] for index in shown}
        room = width - EDGE - sum(given[index] + PAD for index in shown)
        for index in shown:  # what is left goes to the text columns, up to their widest cell
            if columns[index].wraps and room > 0:
                extra = min(room, widest[index] - given[index])
                given[index] += extra
                room -= extra
        table = Table(title=title if number == 0 else None, title_justify="left")
        for index in shown:
            table.add_column(columns[index].header, justify=columns[index].justify, overflow="fold",
                             min_width=given[index], max_width=given[index])
        for row in rows:
            table.add_row(*[row[index] for index in shown])
        tables.append(table)
    return Group(*tables)
