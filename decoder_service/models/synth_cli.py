"""``tooltrie model synth``: write a seeded synthetic checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from decoder_service.models.synth import DTYPES, PRESETS, write_synthetic_checkpoint


@click.command("synth")
@click.option("--config", "config_name", type=click.Choice(sorted(PRESETS)), required=True, help="Model shape.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to write (created if missing).",
)
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="bf16", show_default=True)
def synth(config_name: str, seed: int, out_dir: Path, dtype: str) -> None:
    """Write a Hugging Face-layout checkpoint with seeded random weights and a real tokenizer."""
    path = write_synthetic_checkpoint(config_name, seed, out_dir, dtype=dtype)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    click.echo(f"wrote {config_name} (seed {seed}, {dtype}) to {path}: {size / 1e6:.1f} MB")
