"""`outbox prefect files DIR`: the Prefect files of outbox's deployments, written where an application keeps them.

    the installed package's copies (outbox/deploy/ in the wheel, deploy/ in a clone)
        ─ checked: DIR is a folder or can be one, no file there is overwritten unless asked
        ─ written beside their final names, then renamed into DIR: prefect.yaml (outbox-drain and
          outbox-purge, naming the flows by module: outbox_flows.drain:drain, outbox_flows.purge:purge),
          prefect-automations.yaml (crash the runs of a dead worker), prefect-notify.yaml (notify)
        ─ with --cells: the cells file (OUTBOX_CELLS_FILE, its names only: no URL is read) ─▶ prefect.yaml holds
          one outbox-drain-<cell> and one outbox-purge-<cell> per cell, in the file's order, each the shipped
          deployment with `cell: <cell>` among its parameters and the tag `cell:<cell>`; all on the one
          work pool (a worker serves every cell). A cell added: write the files again (--overwrite), then
          `prefect deploy --all`

Prefect's own CLI applies them (`prefect deploy --prefect-file DIR/prefect.yaml`, `prefect automation create
--from-file ...`), so they can be read, edited and committed like any prefect.yaml. Nothing here needs Prefect.
"""

from __future__ import annotations

import re
from pathlib import Path

import typer

FILES = ("prefect.yaml", "prefect-automations.yaml", "prefect-notify.yaml")

DIRECTORY_ARGUMENT = typer.Argument(
    ..., metavar="DIR", file_okay=False, help="The folder to write them to (made if missing), e.g. deploy/."
)

app = typer.Typer(no_args_is_help=True, help="Outbox's Prefect deployments and automations, as files.")


# the deployments written once per cell with --cells
PER_CELL = ("outbox-drain", "outbox-purge")


@app.command()
def files(
    directory: Path = DIRECTORY_ARGUMENT,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files DIR already holds."),
    cells: bool = typer.Option(
        False,
        "--cells",
        help="One outbox-drain-<cell> and outbox-purge-<cell> deployment per cell of the cells file"
        " (OUTBOX_CELLS_FILE), all on one work pool.",
    ),
) -> None:
    """Write prefect.yaml (the outbox-drain and outbox-purge deployments), prefect-automations.yaml and
    prefect-notify.yaml to DIR, for `prefect deploy` and `prefect automation create`."""
    targets = [directory / name for name in FILES]
    contents = {target: (_shipped() / target.name).read_bytes() for target in targets}
    if cells:
        from outbox.cells import load_cells

        names = load_cells().names  # checked whole; the URLs are not read
        deployments = directory / "prefect.yaml"
        contents[deployments] = per_cell(contents[deployments].decode(), names).encode()
    present = [target.name for target in targets if target.exists()]
    if present and not overwrite:
        raise ValueError(f"{directory} already holds {', '.join(present)}: pass --overwrite to replace them")
    _write_all(contents, directory)
    for target in targets:
        typer.echo(f"wrote {target}")


def per_cell(shipped: str, cells: tuple[str, ...]) -> str:
    """The shipped prefect.yaml with each deployment of PER_CELL written once per cell: named
    `<deployment>-<cell>`, `cell: <cell>` among its parameters, `cell:<cell>` among its tags."""
    head, _, body = shipped.partition("\ndeployments:\n")
    blocks = re.split(r"\n(?=\n)", body)  # a deployment: its comment lines and its entry, then a blank line
    written = []
    for block in blocks:
        name = re.search(r"^  - name: (\S+)$", block, re.MULTILINE)
        if name is None or name.group(1) not in PER_CELL:
            written.append(block)
            continue
        entry = block[name.start() :].rstrip("\n")
        copies = [
            block[: name.start()].rstrip("\n"),
            *(_for_cell(entry, name.group(1), cell) for cell in cells),
        ]
        written.append("\n".join(part for part in copies if part))
    said = (
        "# A drain and a purge deployment per cell of the cells file (`outbox prefect files DIR --cells`); a cell\n"
        "# added: write this file again with --overwrite, then deploy --all. Every cell's deployments share the\n"
        "# work pool: a worker added serves every cell.\n"
    )
    return f"{head}\n{said}deployments:\n" + "\n".join(written).rstrip("\n") + "\n"


def _for_cell(entry: str, deployment: str, cell: str) -> str:
    entry = entry.replace(f"  - name: {deployment}\n", f"  - name: {deployment}-{cell}\n", 1)
    entry = re.sub(r"^(    parameters:\n)", rf"\g<1>      cell: {cell}\n", entry, count=1, flags=re.MULTILINE)
    return re.sub(r"^(    tags: \[.*)\]$", rf'\g<1>, "cell:{cell}"]', entry, count=1, flags=re.MULTILINE)


def _shipped() -> Path:
    """The folder of the packaged files: inside the package in a wheel, deploy/ at the top of a clone."""
    package = Path(__file__).resolve().parent.parent
    packaged = package / "deploy"
    return packaged if packaged.is_dir() else package.parent / "deploy"


def _write_all(contents: dict[Path, bytes], directory: Path) -> None:
    """Every file or none: each is written beside its final name first, and only then renamed into place."""
    made = not directory.exists()
    written: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for target, content in contents.items():
            partial = target.with_name(f".{target.name}.partial")
            written.append(partial)
            partial.write_bytes(content)
    except OSError as error:
        for partial in written:
            if partial.is_file():
                partial.unlink()
        if made and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
        raise ValueError(f"cannot write to {directory}: {error.strerror or error}") from None
    for partial, target in zip(written, contents, strict=True):
        partial.replace(target)
