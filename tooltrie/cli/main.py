"""The `tooltrie` command line."""

from __future__ import annotations

import click

from tooltrie.cli.catalog import catalog
from tooltrie.cli.decoder import decode, decoder
from tooltrie.cli.registry import registry
from tooltrie.cli.up import up
from tooltrie.cubin_kernels import cuda_compare_command
from tooltrie.cuda_build import cuda_build_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """tooltrie: a catalog registry and a decoder that answers with exactly k tool names."""


main.add_command(registry)
main.add_command(catalog)
main.add_command(up)
main.add_command(decoder)
main.add_command(decode)


@main.group()
def cuda() -> None:
    """Build the CUDA kernels, and compare two builds kernel by kernel."""


cuda.add_command(cuda_build_command)
cuda.add_command(cuda_compare_command)


@main.group()
def model() -> None:
    """Model files: synthetic checkpoints for tests and benchmarks."""


def _register_decoder_commands() -> None:
    # Imported here: they pull numpy models and tokenizers, which the registry commands do not need.
    from decoder_service.engines.local_cli import decode_local
    from decoder_service.models.synth_cli import synth

    main.add_command(decode_local)
    model.add_command(synth)


_register_decoder_commands()


if __name__ == "__main__":
    main()
