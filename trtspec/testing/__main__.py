"""Write the example checkpoints: `python -m trtspec.testing DIR` prints `name<TAB>path` per line."""

import argparse

from trtspec.testing.factory import write_example


def main(argv: list[str] | None = None) -> None:
    """Write base/, medusa/ and eagle/ under DIR and print their paths."""
    parser = argparse.ArgumentParser(prog="python -m trtspec.testing", description=__doc__)
    parser.add_argument("dir", help="output folder (created if missing)")
    args = parser.parse_args(argv)
    for name, path in write_example(args.dir).items():
        print(f"{name}\t{path}")


if __name__ == "__main__":
    main()
