"""Cells: several outbox databases, each a cell with a name, run as one system.

A team that splits its data over several PostgreSQL primaries (by region, tenant group or shard) names its
cells in one file, and every command, executor and exporter reads that file:

    OUTBOX_CELLS_FILE ─▶ cells.toml ─ read_cells ─▶ Cells (in the file's order; checked whole before use)
        [cells.<name>]  one of: database_url           the URL itself
                                database_url_variable  an environment variable that holds it
    Cells.url(name) ─▶ the cell's database URL, read from where the file says, once per process; a variable
                       that is unset ─▶ each URL source, in the order added (the Prefect flows add the
                       Secret block outbox-cell-<name>) ─ none ─▶ CellsError naming every place asked
    Cells.urls()    ─▶ every cell's URL; two cells on one database (same hosts, ports and database) refused

With no file there are no cells: one database, given by `--database-url` / `OUTBOX_DATABASE_URL`, as always.

Every check is made before any cell is touched, and every error names the file and the cell: a cell named
twice, a name a metric label or a Prefect deployment cannot carry, an unknown key, no source or two, an
unknown cell name, a variable or block that holds nothing, two cells that point at one database. The URLs
never reach an error: a cell's URL is shown only as `shown_database` renders it.

This module loads only the standard library and outbox's engines (`outbox._internal.connections.engines`), so the
operator commands stay light.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from outbox.errors import OutboxError

CELLS_FILE_VARIABLE = "OUTBOX_CELLS_FILE"
# a cell's name: a metric label value, a Prefect deployment's and tag's suffix, a command-line word
CELL_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
SOURCES = ("database_url", "database_url_variable")
# at most this many cells: each is a label value of every metric, and a process of the exporter holds an
# engine per cell
MAX_CELLS = 64


class CellsError(OutboxError, ValueError):
    """The cells file, or a cell named on the command line, is wrong; the message names the file and the
    cell, never a URL's password."""


@dataclass(frozen=True)
class Cell:
    name: str
    # which of SOURCES the file gives, and its value (the URL itself only for `database_url`)
    source: str
    value: str

    def where(self) -> str:
        """Where the cell's URL is read, for a message: never the URL itself."""
        return f"the environment variable {self.value}" if self.source == "database_url_variable" else "the cells file"


@dataclass
class Cells:
    """The cells of one file, in its order."""

    path: Path
    cells: tuple[Cell, ...]
    _urls: dict[str, str] = field(default_factory=dict, repr=False)

    def __iter__(self) -> Iterator[Cell]:
        return iter(self.cells)

    def __len__(self) -> int:
        return len(self.cells)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(cell.name for cell in self.cells)

    def cell(self, name: str) -> Cell:
        for cell in self.cells:
            if cell.name == name:
                return cell
        raise CellsError(f"no cell {name!r} in {self.path}: its cells are {', '.join(self.names)}")

    def url(self, name: str) -> str:
        """The database URL of cell `name`, after every cell's URL was read and checked (`urls`)."""
        self.cell(name)
        return self.urls()[name]

    def urls(self) -> dict[str, str]:
        """Every cell's database URL, read once; CellsError when one cannot be read, or two cells share a
        database."""
        if not self._urls:
            urls = {cell.name: _read_url(self.path, cell) for cell in self.cells}
            _refuse_shared_databases(self.path, urls)
            self._urls.update(urls)
        return dict(self._urls)


def cells_file() -> Path | None:
    """The cells file named by OUTBOX_CELLS_FILE; None when the variable is unset or empty (one database)."""
    value = os.environ.get(CELLS_FILE_VARIABLE, "").strip()
    return Path(value) if value else None


def load_cells() -> Cells:
    """The cells of the file OUTBOX_CELLS_FILE names; CellsError when none is named."""
    path = cells_file()
    if path is None:
        raise CellsError(f"no cells are named: set {CELLS_FILE_VARIABLE} to the cells file (cells.toml)")
    return read_cells(path)


def read_cells(path: Path) -> Cells:
    """The cells `path` names, each checked; CellsError naming the file (and the cell) for the first fault."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CellsError(f"cannot read the cells file {path}: {type(error).__name__}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        twice = re.search(r"Cannot (?:declare|overwrite a value)[^(]*\('cells', '([^']*)'", str(error))
        if twice:
            raise CellsError(f"{path}: the cell {twice.group(1)!r} is named twice") from None
        raise CellsError(f"{path} is not TOML: {error}") from None
    unknown = sorted(set(document) - {"cells"})
    if unknown:
        raise CellsError(f"{path}: unknown table or key {unknown[0]!r}; the file holds [cells.<name>] tables")
    tables = document.get("cells")
    if not isinstance(tables, dict) or not tables:
        raise CellsError(f"{path} names no cell: add a [cells.<name>] table with a database_url_variable")
    if len(tables) > MAX_CELLS:
        raise CellsError(f"{path} names {len(tables)} cells; at most {MAX_CELLS}")
    return Cells(path, tuple(_cell(path, name, table) for name, table in tables.items()))


def _cell(path: Path, name: str, table: object) -> Cell:
    if not CELL_NAME.fullmatch(name):
        raise CellsError(
            f"{path}: the cell name {name!r} is not a cell name: a lowercase letter, then up to 30 lowercase"
            " letters, digits or hyphens"
        )
    if not isinstance(table, dict):
        raise CellsError(f"{path}: cell {name} is not a table; write [cells.{name}]")
    unknown = sorted(set(table) - set(SOURCES))
    if unknown:
        raise CellsError(f"{path}: cell {name} has an unknown key {unknown[0]!r}; its keys are {', '.join(SOURCES)}")
    given = [key for key in SOURCES if key in table]
    if len(given) != 1:
        raise CellsError(
            f"{path}: cell {name} gives {len(given)} of {', '.join(SOURCES)}; give exactly one"
            " (database_url_variable keeps the password out of the file)"
        )
    value = table[given[0]]
    if not isinstance(value, str) or not value.strip():
        raise CellsError(f"{path}: cell {name}'s {given[0]} is not a non-empty string")
    return Cell(name, given[0], value.strip())


# a function of a cell's name: its database URL, or None; and where it looks, as an error names it
UrlSource = Callable[[str], str | None]
SourceLabel = Callable[[str], str]
_SOURCES: list[tuple[UrlSource, SourceLabel]] = []


def add_url_source(source: UrlSource, *, label: SourceLabel) -> None:
    """Ask `source(cell name)` for the URL of a cell whose variable is unset; sources are asked in the order
    added, and None passes to the next. `label(cell name)` says where the source looks, for the error."""
    _SOURCES.append((source, label))


def _read_url(path: Path, cell: Cell) -> str:
    url = cell.value if cell.source == "database_url" else os.environ.get(cell.value, "").strip()
    asked = [cell.where()]
    for source, label in _SOURCES if not url else ():
        asked.append(label(cell.name))
        try:
            url = (source(cell.name) or "").strip()
        except Exception as error:
            raise CellsError(f"{path}: cell {cell.name}: {label(cell.name)} failed ({type(error).__name__})") from None
        if url:
            break
    if not url:
        raise CellsError(f"{path}: cell {cell.name} has no database URL: {' nor '.join(asked)} holds one")
    _database(path, cell.name, url)  # a URL that cannot be read: refused before any cell is touched
    return url


def _database(path: Path, name: str, url: str) -> set[tuple[str, int, str]]:
    """What a connection to `url` may reach: each of its servers (host, port) with its database name; a
    local server's names (localhost, ::1) as 127.0.0.1."""
    from outbox._internal.connections.engines import InvalidDatabaseUrl, parsed_database_url

    try:
        parsed = parsed_database_url(url)
    except InvalidDatabaseUrl as error:
        raise CellsError(f"{path}: cell {name}: {error}") from None
    hosts = parsed.query.get("host")
    listed = (hosts,) if isinstance(hosts, str) else tuple(hosts or ())
    servers = [_server(entry, parsed.port) for entry in listed] or [(parsed.host or "localhost", parsed.port or 5432)]
    database = parsed.database or parsed.username or ""
    return {(_LOCAL_NAMES.get(host.lower(), host.lower()), port, database) for host, port in servers}


def _server(entry: str, default_port: int | None) -> tuple[str, int]:
    host, _, port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
    return host, int(port) if port.isdigit() else default_port or 5432


_LOCAL_NAMES = {"localhost": "127.0.0.1", "::1": "127.0.0.1", "[::1]": "127.0.0.1"}


def _refuse_shared_databases(path: Path, urls: dict[str, str]) -> None:
    """CellsError when two cells' URLs reach one database (a server and database name they share)."""
    seen: dict[tuple[str, int, str], str] = {}
    for name, url in urls.items():
        for server in sorted(_database(path, name, url)):
            other = seen.setdefault(server, name)
            if other != name:
                host, port, database = server
                raise CellsError(
                    f"{path}: cells {other} and {name} point at one database ({database} on {host}:{port});"
                    " each cell is a database of its own"
                )
