"""`tooltrie catalog push|list|show|versions|diff|activate|rollback|audit`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tooltrie.cli.common import registry_options, reports_rpc_errors
from tooltrie.client import RegistryClient
from tooltrie.registry.v1 import registry_pb2 as pb

_STATE_NAMES = {
    pb.VERSION_STATE_STAGED: "staged",
    pb.VERSION_STATE_ACTIVE: "active",
    pb.VERSION_STATE_RETIRED: "retired",
}


def describe_version(v: pb.CatalogVersion) -> str:
    created = v.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"{v.catalog} v{v.number}  {_STATE_NAMES.get(v.state, '?'):7}  {v.tool_count:6} tools  "
        f"sha256 {v.content_sha256[:12]}  by {v.author}  {created} UTC  parent v{v.parent}"
    )


@click.group()
def catalog() -> None:
    """Push, inspect, activate and roll back catalogs."""


@catalog.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--catalog", "name", required=True, help="Catalog name (1-128 characters of [A-Za-z0-9_.-]).")
@click.option("--activate", is_flag=True, help="Activate the pushed version.")
@registry_options
@reports_rpc_errors
def push(client: RegistryClient, file: Path, name: str, activate: bool) -> None:
    """Push FILE (an MCP tools/list result, as is) as the catalog's next version."""
    response = client.push(name, file.read_bytes(), activate=activate)
    verb = "pushed" if response.created else "unchanged, existing"
    click.echo(f"{verb}: {describe_version(response.version)}")


@catalog.command(name="list")
@registry_options
@reports_rpc_errors
def list_catalogs(client: RegistryClient) -> None:
    """List catalogs with their active and latest versions."""
    rows = list(client.catalogs())
    if not rows:
        click.echo("no catalogs; push one with `tooltrie catalog push FILE --catalog NAME`")
        return
    width = max(len(c.name) for c in rows)
    click.echo(f"{'catalog':{width}}  active  latest")
    for c in rows:
        click.echo(f"{c.name:{width}}  {c.active_version or '-':>6}  {c.latest_version:>6}")


@catalog.command()
@click.argument("name")
@click.option("--version", type=int, default=0, help="Version number; default the active one.")
@click.option("--json", "as_json", is_flag=True, help="Print the tools as an MCP tools/list result.")
@registry_options
@reports_rpc_errors
def show(client: RegistryClient, name: str, version: int, as_json: bool) -> None:
    """Show a catalog version and its tools."""
    response = client.get(name, version)
    if as_json:
        tools = [tool_as_mcp(t) for t in response.tools]
        click.echo(json.dumps({"tools": tools}, indent=2, ensure_ascii=False))
        return
    click.echo(describe_version(response.version))
    for tool in response.tools:
        summary = tool.description.splitlines()[0] if tool.description else ""
        click.echo(f"  {tool.name}  {summary[:100]}")


def tool_as_mcp(tool: pb.Tool) -> dict[str, object]:
    result: dict[str, object] = json.loads(tool.extra_json) if tool.extra_json else {}
    result["name"] = tool.name
    if tool.description:
        result["description"] = tool.description
    if tool.input_schema_json:
        result["inputSchema"] = json.loads(tool.input_schema_json)
    return result


@catalog.command()
@click.argument("name")
@registry_options
@reports_rpc_errors
def versions(client: RegistryClient, name: str) -> None:
    """List a catalog's versions, newest first."""
    for v in client.versions(name):
        click.echo(describe_version(v))


@catalog.command()
@click.argument("name")
@click.argument("from_version", type=int)
@click.argument("to_version", type=int)
@registry_options
@reports_rpc_errors
def diff(client: RegistryClient, name: str, from_version: int, to_version: int) -> None:
    """Tools added, removed and changed from FROM_VERSION to TO_VERSION."""
    response = client.diff(name, from_version, to_version)
    for tool in response.added:
        click.echo(f"+ {tool}")
    for tool in response.removed:
        click.echo(f"- {tool}")
    for change in response.changed:
        click.echo(f"~ {change.name} ({', '.join(change.fields)})")
    if not (response.added or response.removed or response.changed):
        click.echo("no differences")


@catalog.command()
@click.argument("name")
@click.argument("version", type=int)
@click.option("--expect-current", type=int, default=None, help="Only if this version is active now (0: none).")
@registry_options
@reports_rpc_errors
def activate(client: RegistryClient, name: str, version: int, expect_current: int | None) -> None:
    """Make VERSION the catalog's active version."""
    response = client.activate(name, version, expected_current=expect_current)
    click.echo(f"active: {describe_version(response.version)} (was v{response.previous_version})")


@catalog.command()
@click.argument("name")
@registry_options
@reports_rpc_errors
def rollback(client: RegistryClient, name: str) -> None:
    """Re-activate the version that was active before the current one."""
    response = client.rollback(name)
    click.echo(f"rolled back: {describe_version(response.version)} (was v{response.previous_version})")


@catalog.command()
@click.argument("name", required=False, default="")
@click.option("--limit", type=int, default=50, show_default=True)
@registry_options
@reports_rpc_errors
def audit(client: RegistryClient, name: str, limit: int) -> None:
    """The audit log of writes, newest first (every catalog unless NAME is given)."""
    count = 0
    for count, event in enumerate(client.audit(name), 1):
        at = event.at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
        click.echo(f"{at} UTC  {event.actor:12} {event.action:9} {event.catalog} v{event.version}  {event.detail_json}")
        if count >= limit:
            break
    if count == 0:  # say so, rather than print nothing
        click.echo(f"no writes recorded for {name}" if name else "no writes recorded yet")


@catalog.command(name="compile")
@click.argument("name")
@click.option("--tokenizer", "spec", required=True, help="qwen3, qwen3.6, smollm2, gguf:PATH or hf:PATH.")
@click.option("--version", type=int, default=0, help="Version number; default the active one.")
@click.option("--mode", type=click.Choice(["token", "char"]), default="token", show_default=True)
@registry_options
@reports_rpc_errors
def compile_command(client: RegistryClient, name: str, spec: str, version: int, mode: str) -> None:
    """Compile a catalog version for a tokenizer (registering it with the registry) and print the stats."""
    from tooltrie.grammar import load_tokenizer
    from tooltrie.grammar.errors import TokenizerError
    from tooltrie.grammar.tokenizers.blob import to_blob

    try:
        blob = to_blob(load_tokenizer(spec))
    except TokenizerError as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer") from exc
    client.register_tokenizer(
        pb.TokenizerBlob(fingerprint=blob.fingerprint, kind=blob.kind, data=blob.data, name=blob.name)
    )
    response = client.compile(name, version, blob.fingerprint, char_mode=mode == "char")
    result = response.result
    click.echo(
        f"{name} v{response.version.number} for {result.tokenizer_name} ({result.tokenizer_fingerprint[:16]}), "
        f"{mode} mode"
    )
    if not result.ok:
        click.echo(f"compile failed: {result.error}", err=True)
        raise SystemExit(1)
    st = result.stats
    bank = "fits" if st.fits_constant_bank else "does not fit"
    click.echo(
        f"  {st.nodes} nodes, {st.edges} edges, root out-degree {st.root_out_degree}, max out-degree "
        f"{st.max_out_degree}, depth {st.depth}\n  {st.bytes} bytes on the device ({bank} the 64 KiB constant bank), "
        f"compiled in {st.compile_seconds * 1000:.1f} ms"
    )


@catalog.command(name="status")
@click.argument("name")
@registry_options
@reports_rpc_errors
def catalog_status(client: RegistryClient, name: str) -> None:
    """Which decoder runs which version of the catalog, and their last NACK."""
    reply = client.status(name)
    click.echo(f"{name}: active v{reply.active_version or '-'}")
    if not reply.decoders:
        click.echo("  no decoder has subscribed to it")
    for d in reply.decoders:
        state = "connected" if d.connected else "disconnected"
        line = f"  {d.node_id}: v{d.applied_version or '-'} ({state})"
        if d.nacked_version:
            line += f"; refused v{d.nacked_version}: {d.nack_error}"
        click.echo(line)
