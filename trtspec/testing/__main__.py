"""Write the example checkpoints: `python -m trtspec.testing DIR` prints `name<TAB>path` per line."""

import click

from trtspec.testing.factory import write_example


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dir", type=click.Path(file_okay=False))
def main(dir: str) -> None:
    """Write base/, medusa/ and eagle/ under DIR (created if missing) and print their paths."""
    for name, path in write_example(dir).items():
        click.echo(f"{name}\t{path}")


if __name__ == "__main__":
    main(prog_name="python -m trtspec.testing")
