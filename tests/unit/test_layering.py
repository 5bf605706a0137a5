"""The import walls between kbroker's layers (ARCHITECTURE.md), checked on the source: every import
statement, module level or inside a function, resolved to an absolute module name.

- storage (kbroker.log) never imports network, zk, replica, controller, client or server;
- the wire codec (kbroker.protocol) imports nothing of the broker;
- kbroker.zk is ZooKeeper I/O and layout only: no policy (replica, controller, server, log...);
- kbroker.replica and kbroker.controller never import server (server wires them, not the reverse);
- nothing imports kbroker.server except itself and the command that runs a broker.
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"kbroker": ROOT / "kbroker", "kbroker.zk": ROOT / "zk"}

BROKER_PARTS = ("kbroker.server", "kbroker.log", "kbroker.network", "kbroker.zk", "kbroker.replica",
                "kbroker.controller", "kbroker.client", "kbroker.coordinator", "kbroker.cli")
WALLS = {
    "kbroker.log": ("kbroker.network", "kbroker.zk", "kbroker.replica", "kbroker.controller",
                    "kbroker.client", "kbroker.server", "kbroker.coordinator"),
    "kbroker.protocol": BROKER_PARTS,
    "kbroker.zk": ("kbroker.server", "kbroker.replica", "kbroker.controller", "kbroker.log",
                   "kbroker.network", "kbroker.client", "kbroker.coordinator"),
    "kbroker.replica": ("kbroker.server", "kbroker.controller"),
    "kbroker.controller": ("kbroker.server", "kbroker.replica"),
}
# Who may import kbroker.server: the server itself and the command that runs a broker.
SERVER_IMPORTERS = ("kbroker.server", "kbroker.cli.serve")


def modules():
    """(module name, path) of every Python file of the packages."""
    out = []
    for pkg, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = list(rel.parts)
            if pkg == "kbroker" and parts and parts[0] == "zk":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join([pkg] + parts), path))
    return out


def imports_of(name: str, path: Path) -> set:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def violations():
    out = []
    for name, path in modules():
        imported = imports_of(name, path)
        for layer, forbidden in WALLS.items():
            if within(name, layer):
                for mod in imported:
                    for f in forbidden:
                        if within(mod, f) and not within(mod, layer):
                            out.append(f"{name} imports {mod} ({layer} must not import {f})")
        if not any(within(name, allowed) for allowed in SERVER_IMPORTERS):
            out += [f"{name} imports {mod} (nothing imports kbroker.server)"
                    for mod in imported if within(mod, "kbroker.server")]
    return sorted(set(out))


def test_import_walls_hold():
    assert violations() == []


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """A log module importing the replica package is reported (the walk sees lazy imports too)."""
    fake = tmp_path / "kbroker"
    (fake / "log").mkdir(parents=True)
    (fake / "log" / "__init__.py").write_text("")
    (fake / "log" / "bad.py").write_text("def f():\n    from ..replica import manager\n")
    (fake / "other.py").write_text("import kbroker.server.broker\n")
    monkeypatch.setitem(PACKAGES, "kbroker", fake)
    monkeypatch.setitem(PACKAGES, "kbroker.zk", tmp_path / "nozk")
    found = violations()
    assert any("kbroker.log.bad imports kbroker.replica" in v for v in found), found
    assert any("kbroker.other imports kbroker.server" in v for v in found), found


@pytest.mark.parametrize("layer", sorted(WALLS))
def test_each_layer_exists(layer):
    assert any(within(name, layer) for name, _ in modules()), f"no modules found for {layer}"


# The native rooms (ext/), lowest first: a module cimports only rooms of a lower rank. Ranks 0 and 1
# are declarations and inline helpers with no module behind (C headers, then what builds on them); a
# .pxi is part of the module that includes it.
NATIVE_RANKS = {
    "hton": 0, "ccrc32c": 0, "czlib": 0, "errors": 0,
    "varint": 1, "layout": 1,
    "crc": 2, "codec": 2, "batch": 2, "sendio": 2, "tls": 2,
    "segment": 3, "cleaner": 3, "arrow": 3,
    "request": 4,
}
NATIVE_INCLUDES = {"wire": "request", "reqstats": "request", "slots": "request", "produce_path": "request",
                   "fetch_path": "request", "lost": "request", "conn": "request",
                   **{f"segment_{room}": "segment" for room in ("io", "append", "state", "index", "walk", "scan",
                                                                  "logstate", "leader", "blocks")}}
_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport\b|cimport\s+([\w.]+))", re.M)
_NOT_OURS = ("libc", "posix", "cpython", "cython", "libcpp")


def native_violations(ext: Path) -> list[str]:
    out = []
    for path in sorted(p for p in ext.iterdir() if p.suffix in (".pyx", ".pxd", ".pxi")):
        owner = NATIVE_INCLUDES.get(path.stem, path.stem)
        if owner not in NATIVE_RANKS:
            out.append(f"{path.name}: not a known native room (add it to NATIVE_RANKS or NATIVE_INCLUDES)")
            continue
        for m in _CIMPORT.finditer(path.read_text()):
            target = (m.group(1) or m.group(2)).removeprefix("kbroker._native.")
            if target.split(".")[0] in _NOT_OURS:
                continue
            if target not in NATIVE_RANKS:
                out.append(f"{path.name} cimports {target}: not a known native room")
            elif NATIVE_RANKS[target] >= NATIVE_RANKS[owner]:
                out.append(f"{path.name} cimports {target} (rank {NATIVE_RANKS[target]} is not below "
                           f"{owner}'s {NATIVE_RANKS[owner]})")
    return out


def test_native_cimport_walls_hold():
    assert native_violations(ROOT / "ext") == []


def test_the_native_checker_sees_a_violation(tmp_path):
    (tmp_path / "batch.pyx").write_text("from kbroker._native.request cimport Slot\nfrom libc.stdint cimport int32_t\n")
    (tmp_path / "wire.pxi").write_text("from varint cimport read_varint\n")
    (tmp_path / "mystery.pyx").write_text("")
    found = native_violations(tmp_path)
    assert any(v.startswith("batch.pyx cimports request") for v in found), found
    assert any(v.startswith("mystery.pyx: not a known native room") for v in found), found
    assert not any(v.startswith("wire.pxi") for v in found), found


# Each native module's .pxd is its table of contents: every cdef class the module defines (in its .pyx
# or an include) is declared there, fields and C methods with it (Cython then refuses fields declared
# in the implementation, so the class is described in one place).
_CDEF_CLASS = re.compile(r"^cdef\s+class\s+(\w+)", re.M)


def undeclared_classes(ext: Path) -> list[str]:
    out = []
    for path in sorted(p for p in ext.iterdir() if p.suffix in (".pyx", ".pxi")):
        module = NATIVE_INCLUDES.get(path.stem, path.stem)
        pxd = ext / f"{module}.pxd"
        declared = set(_CDEF_CLASS.findall(pxd.read_text())) if pxd.exists() else set()
        out += [f"{path.name}: cdef class {name} is not declared in {module}.pxd"
                for name in _CDEF_CLASS.findall(path.read_text()) if name not in declared]
    return out


def test_every_native_class_is_declared_in_its_pxd():
    assert undeclared_classes(ROOT / "ext") == []


def test_the_pxd_checker_sees_an_undeclared_class(tmp_path):
    (tmp_path / "cleaner.pyx").write_text('"""cdef class Doc"""\n@cython.final\ncdef class OffsetMap:\n    pass\n')
    (tmp_path / "request.pxd").write_text("cdef class Slot:\n    cdef public object header\n")
    (tmp_path / "slots.pxi").write_text("cdef class Slot:\n    pass\n")
    (tmp_path / "wire.pxi").write_text("cdef class _Reader:\n    pass\n")
    assert undeclared_classes(tmp_path) == ["cleaner.pyx: cdef class OffsetMap is not declared in cleaner.pxd",
                                            "wire.pxi: cdef class _Reader is not declared in request.pxd"]
