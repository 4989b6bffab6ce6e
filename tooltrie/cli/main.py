"""The `tooltrie` command line."""

from __future__ import annotations

import click

from tooltrie.cli.catalog import catalog
from tooltrie.cli.registry import registry
from tooltrie.cli.up import up


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """tooltrie: a catalog registry and a decoder that answers with exactly k tool names."""


main.add_command(registry)
main.add_command(catalog)
main.add_command(up)


if __name__ == "__main__":
    main()
