"""The table of levers `perflab levers` prints: readable from 80 columns up."""
from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Narrower than this, the "addresses" column is left out (a hint says where to read it): four wrapped columns
# in 80 columns leave each too narrow to read.
ADDRESSES_MIN_WIDTH = 120
MAX_WIDTH = 160


def levers_table(levers: Iterable, width: int) -> Table:
    """One row per lever: name and flag, what it does, what it needs and (when `width` allows) which
    bottlenecks it addresses; the table fills `width` columns (at most MAX_WIDTH)."""
    addresses = width >= ADDRESSES_MIN_WIDTH
    # Widths by ratio: every column gets its share of the terminal and wraps inside it. (Sized to their
    # content, a no-wrap flag column squeezed the others to nothing at 80 columns.) 4 parts of 10 keep
    # "--activation-checkpointing" whole in 80 columns; longer words (a flag's list of choices) fold.
    table = Table(title="levers", title_justify="left", show_lines=True, expand=True, width=min(width, MAX_WIDTH))
    table.add_column("lever · flag", ratio=4, overflow="fold")
    table.add_column("what it does", ratio=3, overflow="fold")
    table.add_column("needs", ratio=3, overflow="fold")
    if addresses:
        table.add_column("addresses", ratio=2, overflow="fold")
    for lever in levers:
        # escape: "[default|reduce-overhead|...]" in a flag would otherwise read as rich markup and vanish
        cells = [f"[bold]{escape(lever.name)}[/]\n{escape(lever.flag)}", escape(lever.summary), escape(lever.needs)]
        table.add_row(*cells, *([", ".join(lever.classes)] if addresses else []))
    return table


def print_levers(console: Console, levers: Iterable) -> None:
    """The levers table sized to the terminal; narrower than ADDRESSES_MIN_WIDTH, a hint replaces "addresses"."""
    console.print(levers_table(levers, console.width))
    if console.width < ADDRESSES_MIN_WIDTH:
        console.print(f"[dim]which bottlenecks each lever addresses: `perflab levers` in a terminal of "
                      f"{ADDRESSES_MIN_WIDTH}+ columns, or docs/levers.md[/]", highlight=False)
