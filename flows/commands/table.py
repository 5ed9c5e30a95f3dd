"""Tables that fit the terminal: headers, model names and values stay whole; what does not fit goes.

Rich squeezes an over-wide table by cutting every cell into `ti…`. Here each column says whether
its cells may wrap at spaces (`wrap`) and how soon it may go (`drop`); the table is laid out at
render time for the width it gets: columns are dropped, highest `drop` first, until every kept
column fits its header's longest word and its unbreakable cells, and a line under the table names
what was left out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleDimensions, ConsoleOptions, JustifyMethod, RenderResult
from rich.table import Table
from rich.text import Text

WRAP_MIN = 10  # the narrowest a wrapping column gets: a word or two of a reason a line


class TableConsole(Console):
    """A console as wide as $COLUMNS, else the terminal, else `piped_width` when piped (a log keeps wide
    tables). The width is looked up on every print, so a COLUMNS set after import still counts."""

    def __init__(self, piped_width: int) -> None:
        super().__init__()
        self._width = None  # Console fixes the width it saw at start-up; look it up per print instead
        self.piped_width = piped_width

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if os.environ.get("COLUMNS", "").isdigit() or self.is_terminal:
            return size
        return ConsoleDimensions(self.piped_width, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size  # as Console's setter: a size set by hand wins


def table_console(piped_width: int) -> Console:
    """The console every table command prints with (see `TableConsole`)."""
    return TableConsole(piped_width)


@dataclass(frozen=True)
class Column:
    """How a column behaves when the table is narrower than its content."""

    header: str
    justify: JustifyMethod = "left"
    wrap: bool = False  # cells may break at spaces (reasons, comments); otherwise a cell is never broken
    drop: int = 0  # 0: always shown; the table drops the highest first when it does not fit


def _lines(cell: str) -> Iterable[Text]:
    return Text.from_markup(cell).split("\n") if cell else [Text("")]


class FittedTable:
    """A rich renderable: a table laid out for the width it is printed at, plus a line naming dropped columns."""

    def __init__(
        self,
        title: str | None,
        columns: Iterable[Column],
        caption: str | None = None,
        whole_words: bool = False,
        **table_options: Any,
    ) -> None:
        """`whole_words`: columns are dropped (highest `drop` first) until every kept one fits its longest word,
        so no word is ever folded; otherwise only until each fits its floor (`WRAP_MIN`)."""
        self.title, self.caption, self.table_options = title, caption, table_options
        self.whole_words = whole_words
        self.columns = list(columns)
        self.rows: list[list[str]] = []

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"FittedTable.add_row: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])

    def _bounds(self, index: int) -> tuple[int, int, int, int]:
        """(floor, whole words, cells, natural) widths of a column: below `whole words` a wrapping column
        folds its longest word, below `cells` its cells take more than a line, below `natural` the header
        does; a column never gets less than `floor`."""
        column = self.columns[index]
        lines = [line for row in self.rows for line in _lines(row[index])]
        longest = max((line.cell_len for line in lines), default=0)
        header_word = max((len(w) for w in column.header.split()), default=1)
        if column.wrap:
            word = max((len(w) for line in lines for w in line.plain.split()), default=0)
            floor, words = max(header_word, min(word, WRAP_MIN)), max(header_word, word)
        else:
            floor = words = max(header_word, longest)
        return floor, words, max(words, longest), max(words, len(column.header), longest)

    def layout(self, width: int) -> tuple[list[int], list[int], list[str]]:
        """(kept column indexes, their content widths, dropped headers) for a table `width` characters wide."""
        bounds = [self._bounds(i) for i in range(len(self.columns))]
        kept = list(range(len(self.columns)))

        def room() -> int:  # what the borders and padding leave: "│ a │ b │" is 3 per column and 1
            return width - 3 * len(kept) - 1

        need = 1 if self.whole_words else 0  # the bound every kept column must get: its longest word, or its floor
        while sum(bounds[i][need] for i in kept) > room():
            droppable = [i for i in kept if self.columns[i].drop]
            if not droppable:
                break  # nothing may go: rich squeezes the rest as it can
            kept.remove(max(droppable, key=lambda i: (self.columns[i].drop, i)))
        widths = {i: bounds[i][1] for i in kept}
        # too wide for whole words: a column that may be dropped folds before one that may not, the widest first
        while sum(widths.values()) > room():
            foldable = [i for i in kept if widths[i] > bounds[i][0]]
            if not foldable:
                break
            widths[max(foldable, key=lambda i: (self.columns[i].drop, widths[i], i))] -= 1
        spare = room() - sum(widths.values())
        # first until cells keep to one line, then until headers do: the columns that need least first
        # (a date or a threshold made whole reads better than a reason a little wider), then the rest
        # one character at a time to the column furthest below its target, so they grow in proportion
        for target in (2, 3):
            for i in sorted(kept, key=lambda i: (bounds[i][target] - widths[i], i)):
                if 0 < bounds[i][target] - widths[i] <= spare:
                    spare -= bounds[i][target] - widths[i]
                    widths[i] = bounds[i][target]
            while spare > 0:
                short = [i for i in kept if widths[i] < bounds[i][target]]
                if not short:
                    break
                grow = min(short, key=lambda i: widths[i] / bounds[i][target])
                widths[grow] += 1
                spare -= 1
        dropped = [self.columns[i].header for i in range(len(self.columns)) if i not in kept]
        return kept, [widths[i] for i in kept], dropped

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        kept, widths, dropped = self.layout(options.max_width)
        table = Table(title=self.title, caption=self.caption, **self.table_options)
        for i, width in zip(kept, widths):
            column = self.columns[i]
            table.add_column(column.header, justify=column.justify, width=width, overflow="fold")
        for row in self.rows:
            table.add_row(*(row[i] for i in kept))
        yield table
        if dropped:
            yield Text(
                f"not shown at {options.max_width} columns: {', '.join(dropped)} "
                "(a wider terminal, or COLUMNS=200, shows them)",
                style="dim",
            )
