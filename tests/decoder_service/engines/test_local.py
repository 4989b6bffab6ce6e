from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from decoder_service.engines.base import PointerEvent, SummaryEvent
from decoder_service.engines.catalog import read_catalog_file
from decoder_service.engines.local import decode_local
from decoder_service.engines.local_cli import decode_local as decode_local_cli

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "catalogs" / "workplace.json"


def test_decode_local_streams_pointers_then_summary(tiny_dir: Path) -> None:
    events = list(decode_local("Create a ticket for the outage", EXAMPLE, 3, model_path=tiny_dir))
    names = {t.name for t in read_catalog_file(EXAMPLE)[0]}
    assert [type(e) for e in events] == [PointerEvent] * 3 + [SummaryEvent]
    assert len({e.name for e in events[:3]}) == 3 and {e.name for e in events[:3]} <= names


def test_cli_json_lines(tiny_dir: Path) -> None:
    args = ["Create a ticket for the outage", "--catalog", str(EXAMPLE), "-k", "2", "--model", str(tiny_dir), "--json"]
    result = CliRunner().invoke(decode_local_cli, args)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [line["index"] for line in lines[:2]] == [0, 1]
    assert all(isinstance(line["tool"], str) for line in lines[:2])
    assert lines[2]["summary"]["tokens_generated"] >= 4


def test_cli_text_and_errors(tiny_dir: Path, tmp_path: Path) -> None:
    ok = CliRunner().invoke(
        decode_local_cli, ["Create a ticket", "--catalog", str(EXAMPLE), "-k", "1", "--model", str(tiny_dir)]
    )
    assert ok.exit_code == 0 and ok.output.startswith("1. ") and "ms/token" in ok.output
    small = tmp_path / "two.json"
    small.write_text(json.dumps({"tools": [{"name": "a.b"}, {"name": "c.d"}]}))
    bad = CliRunner().invoke(
        decode_local_cli, ["Create a ticket", "--catalog", str(small), "-k", "3", "--model", str(tiny_dir)]
    )
    assert bad.exit_code == 1 and "k=3 exceeds the catalog's 2 tools" in bad.output
    many = CliRunner().invoke(decode_local_cli, ["x", "--catalog", str(EXAMPLE), "-k", "17", "--model", str(tiny_dir)])
    assert many.exit_code == 2 and "17" in many.output
