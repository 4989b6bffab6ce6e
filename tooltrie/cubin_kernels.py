"""What each kernel of a cubin runs: its machine code, relocations and register count.

A cubin is an ELF file; kernel K's machine code is section ``.text.K`` and its relocations ``.rel(a).text.K``; the
``.nv.info`` section holds attributes, among them each kernel's register count (EIATTR_REGCOUNT) by symbol index.
Comparing two cubins kernel by kernel tells which kernels a source change reached: a kernel whose code and
relocations are the same runs the same instructions as before, so its bit checks still hold for it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import click

_ELF_MAGIC = b"\x7fELF"
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")  # ELF64 Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_SHT_SYMTAB, _SHT_RELA, _SHT_REL = 2, 4, 9
_TEXT = ".text."
# .nv.info entries: format byte, attribute byte, then a 16-bit value, or (format EIFMT_SVAL) a 16-bit payload size
# and the payload; EIATTR_REGCOUNT's payload is (symbol index, count) as two 32-bit words.
_EIFMT_SVAL, _EIATTR_REGCOUNT = 0x04, 0x2F


@dataclass(frozen=True, slots=True)
class KernelCode:
    """One kernel's machine code as the loader sees it. Relocations are resolved to symbol names, so a symbol
    table reordered by another kernel's change does not read as a change of this one."""

    code: bytes
    relocations: tuple[tuple[int, int, str, int], ...]  # (offset, type, symbol, addend)
    registers: int

    def same_code(self, other: KernelCode) -> bool:
        return (self.code, self.relocations) == (other.code, other.relocations)


@dataclass(frozen=True, slots=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


def _c_string(table: bytes, at: int) -> str:
    return table[at : table.index(b"\0", at)].decode()


def _sections(data: bytes) -> list[_Section]:
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    raw = [_SECTION_HEADER.unpack_from(data, shoff + i * entsize) for i in range(count)]
    names = raw[names_index]
    strings = data[names[4] : names[4] + names[5]]
    return [_Section(_c_string(strings, s[0]), s[1], s[4], s[5], s[6]) for s in raw]


def _symbol_names(data: bytes, sections: list[_Section]) -> list[str]:
    table = next((s for s in sections if s.type == _SHT_SYMTAB), None)
    if table is None:
        return []
    strings = sections[table.link]
    names = data[strings.offset : strings.offset + strings.size]
    return [
        _c_string(names, _SYMBOL.unpack_from(data, table.offset + i * _SYMBOL.size)[0])
        for i in range(table.size // _SYMBOL.size)
    ]


def _register_counts(data: bytes, sections: list[_Section], symbols: list[str]) -> dict[str, int]:
    counts = {}
    for info in (s for s in sections if s.name == ".nv.info"):
        at, end = info.offset, info.offset + info.size
        while at + 4 <= end:
            fmt, attr, value = struct.unpack_from("<BBH", data, at)
            at += 4
            if fmt != _EIFMT_SVAL:
                continue
            if attr == _EIATTR_REGCOUNT and value == 8:
                index, count = struct.unpack_from("<II", data, at)
                if index < len(symbols):
                    counts[symbols[index]] = count
            at += value
    return counts


def _relocations(data: bytes, section: _Section, symbols: list[str]) -> list[tuple[int, int, str, int]]:
    entry = 24 if section.type == _SHT_RELA else 16
    out = []
    for at in range(section.offset, section.offset + section.size, entry):
        offset, info = struct.unpack_from("<QQ", data, at)
        addend = struct.unpack_from("<q", data, at + 16)[0] if entry == 24 else 0
        index = info >> 32
        out.append((offset, info & 0xFFFFFFFF, symbols[index] if index < len(symbols) else f"#{index}", addend))
    return out


def read_kernels(cubin: Path | str) -> dict[str, KernelCode]:
    """Every kernel in the cubin, by name. Raises ValueError for a file that is not a whole cubin."""
    path = Path(cubin)
    data = path.read_bytes()
    if data[:4] != _ELF_MAGIC or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file (a cubin built with nvcc -cubin)")
    try:
        return _kernels(data)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is a truncated or damaged ELF file ({exc})") from exc


def _kernels(data: bytes) -> dict[str, KernelCode]:
    sections = _sections(data)
    symbols = _symbol_names(data, sections)
    by_name = {s.name: s for s in sections}
    registers = _register_counts(data, sections, symbols)
    kernels = {}
    for section in sections:
        if not section.name.startswith(_TEXT):
            continue
        name = section.name[len(_TEXT) :]
        relocations: list[tuple[int, int, str, int]] = []
        for prefix in (".rela", ".rel"):
            if (rel := by_name.get(prefix + section.name)) is not None:
                relocations += _relocations(data, rel, symbols)
        kernels[name] = KernelCode(
            code=data[section.offset : section.offset + section.size],
            relocations=tuple(sorted(relocations)),
            registers=registers.get(name, 0),
        )
    return kernels


@dataclass(frozen=True, slots=True)
class KernelChange:
    name: str
    before: KernelCode | None
    after: KernelCode | None

    @property
    def same(self) -> bool:
        return self.before is not None and self.after is not None and self.before.same_code(self.after)

    def describe(self) -> str:
        if self.before is None or self.after is None:
            return f"{self.name}: only in the {'second' if self.before is None else 'first'} cubin"
        if self.same:
            return f"{self.name}: same code ({len(self.after.code)} bytes, {self.after.registers} registers)"
        b, a = self.before, self.after
        return f"{self.name}: differs: {len(b.code)} -> {len(a.code)} bytes, {b.registers} -> {a.registers} registers"


def compare_cubins(before: Path | str, after: Path | str) -> list[KernelChange]:
    """Each kernel of either cubin, by name, with its code in each (None where a cubin lacks it)."""
    old, new = read_kernels(before), read_kernels(after)
    return [KernelChange(name, old.get(name), new.get(name)) for name in sorted(old.keys() | new.keys())]


@click.command("compare")
@click.argument("before", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("after", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--all", "show_all", is_flag=True, help="List the kernels with the same code too.")
def cuda_compare_command(before: Path, after: Path, show_all: bool) -> None:
    """Name the kernels whose machine code differs between two cubins.

    Exits 0 if all run the same code, 1 if any kernel differs or is in one cubin only, 2 if a file is not a cubin
    (as cmp does)."""
    try:
        changes = compare_cubins(before, after)
    except ValueError as exc:
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(2) from exc
    for change in changes:
        if show_all or not change.same:
            click.echo(change.describe())
    differing = sum(not change.same for change in changes)
    click.echo(f"{len(changes) - differing} of {len(changes)} kernels run the same code; {differing} differ")
    if differing:
        raise SystemExit(1)
