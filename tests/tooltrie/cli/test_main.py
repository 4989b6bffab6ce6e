"""Every command of the `tooltrie` line: its function takes exactly the options it declares."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click

from tooltrie.cli.main import main

# registry_options turns --registry, --token and --tls-ca into one `client` argument.
REGISTRY_OPTIONS = {"registry", "token", "tls_ca"}


def commands(group: click.Group, path: str = "tooltrie") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, f"{path} {name}")
        else:
            yield f"{path} {name}", command


def test_each_command_takes_the_options_it_declares() -> None:
    """A parameter the function reads but no option declares fails every run of the command (TypeError before it
    starts); an option the function does not take, the same. Neither shows until someone runs it."""
    seen = []
    for path, command in commands(main):
        declared = {p.name for p in command.params}
        taken = set(inspect.signature(inspect.unwrap(command.callback)).parameters)
        if "client" in taken and declared >= REGISTRY_OPTIONS:
            declared, taken = declared - REGISTRY_OPTIONS, taken - {"client"}
        assert taken == declared, f"{path}: takes {sorted(taken - declared)}, declares {sorted(declared - taken)}"
        seen.append(path)
    assert {"tooltrie decoder serve", "tooltrie up", "tooltrie catalog push", "tooltrie decode"} <= set(seen)
