"""`outbox prefect files DIR`: the Prefect files of outbox's deployments, written where an application keeps them.

    the installed package's copies (outbox/deploy/ in the wheel, deploy/ in a clone)
        ─ checked: DIR is a folder or can be one, no file there is overwritten unless asked
        ─ written beside their final names, then renamed into DIR: prefect.yaml (outbox-drain and
          outbox-purge, naming the flows by module: outbox_flows.drain:drain, outbox_flows.purge:purge),
          prefect-automations.yaml (crash the runs of a dead worker), prefect-notify.yaml (notify)

Prefect's own CLI applies them (`prefect deploy --prefect-file DIR/prefect.yaml`, `prefect automation create
--from-file ...`), so they can be read, edited and committed like any prefect.yaml. Nothing here needs Prefect.
"""

from __future__ import annotations

from pathlib import Path

import typer

FILES = ("prefect.yaml", "prefect-automations.yaml", "prefect-notify.yaml")

DIRECTORY_ARGUMENT = typer.Argument(
    ..., metavar="DIR", file_okay=False, help="The folder to write them to (made if missing), e.g. deploy/."
)

app = typer.Typer(no_args_is_help=True, help="Outbox's Prefect deployments and automations, as files.")


@app.command()
def files(
    directory: Path = DIRECTORY_ARGUMENT,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the files DIR already holds."),
) -> None:
    """Write prefect.yaml (the outbox-drain and outbox-purge deployments), prefect-automations.yaml and
    prefect-notify.yaml to DIR, for `prefect deploy` and `prefect automation create`."""
    targets = [directory / name for name in FILES]
    present = [target.name for target in targets if target.exists()]
    if present and not overwrite:
        raise ValueError(f"{directory} already holds {', '.join(present)}: pass --overwrite to replace them")
    _write_all({target: (_shipped() / target.name).read_bytes() for target in targets}, directory)
    for target in targets:
        typer.echo(f"wrote {target}")


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
