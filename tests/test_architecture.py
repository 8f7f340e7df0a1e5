"""docs/architecture.md's map of rooms holds: the ``rooms`` block there is the one table of
allowed imports, and the package's real imports (read with ``ast``, module level and inside
functions) are checked against it."""

from __future__ import annotations

import ast
import re

from helpers import PACKAGE, cycles, package_modules, runtime_imports

DOC = PACKAGE.parent / "docs" / "architecture.md"


def _drawing() -> tuple[dict[str, list[str]], dict[tuple[str, str], str]]:
    """The ``rooms`` block: room -> the rooms it may import (in the block's order), and the
    exceptions (importing module, imported module) -> reason; names relative to the package."""
    (block,) = re.findall(r"^```rooms\n(.*?)^```", DOC.read_text(), re.M | re.S)
    rooms, exceptions = {}, {}
    for raw in block.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and raw[0].isspace():
            rooms[next(reversed(rooms))] += line.split()
        elif "->" in line:
            edge, reason = line.split(":", 1)
            importer, target = (n.strip() for n in edge.split("->"))
            assert reason.strip(), f"exception {edge!r} gives no reason"
            exceptions[importer, target] = reason.strip()
        elif line:
            room, *deps = line.split()
            rooms[room] = deps
    return rooms, exceptions


def _room(module: str, rooms) -> str | None:
    """The drawn room holding ``module`` (the longest match: ``training.callback`` before
    ``training``); None for the package root and for a module no room holds."""
    name = module.removeprefix("megatron_gamma").removeprefix(".")
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in rooms:
            return ".".join(parts[:k])
    return None


def _cross_room_imports(rooms):
    """(importing module, its room, Import, imported room) for every import between rooms."""
    out = []
    for module, path in package_modules().items():
        for imp in runtime_imports(path):
            a, b = _room(module, rooms), _room(imp.target, rooms)
            if a and b and a != b:
                out.append((module, a, imp, b))
    return out


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_drawing_is_one_way_and_names_only_real_modules():
    rooms, exceptions = _drawing()
    modules = {m.removeprefix("megatron_gamma.") for m in package_modules()}
    order = list(rooms)
    for i, (room, deps) in enumerate(rooms.items()):
        assert room in modules, f"room {room!r} is drawn but is no module of the package"
        above = order[:i]
        assert [d for d in deps if d not in above] == [], (
            f"{room} may import only rooms drawn above it: {above}"
        )
    for importer, target in exceptions:
        assert {importer, target} <= modules, f"exception {importer} -> {target}: no such module"
        assert order.index(_room(importer, rooms)) < order.index(_room(target, rooms)), (
            f"exception {importer} -> {target} runs with the order: draw it as an arrow instead"
        )


def test_every_room_of_the_package_is_drawn():
    rooms, _ = _drawing()
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    top |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert sorted(top - rooms.keys()) == []


def test_every_import_follows_the_drawing():
    """The room graph of the real imports is a subgraph of the drawn one, so what a room reaches
    through any chain of imports, it reaches through drawn arrows."""
    rooms, exceptions = _drawing()
    allowed = {room: set(deps) for room, deps in rooms.items()}
    for importer, target in exceptions:
        allowed[_room(importer, rooms)].add(_room(target, rooms))
    bad = []
    for module, a, imp, b in _cross_room_imports(rooms):
        pair = (module.removeprefix("megatron_gamma."), imp.target.removeprefix("megatron_gamma."))
        if b in rooms[a] or (pair in exceptions and imp.deferred):
            continue
        real = {r: set(deps) for r, deps in allowed.items()}
        real[a].add(b)
        gained = sorted(_reach(real, a) - _reach(allowed, a))
        how = "at module level, " if pair in exceptions else ""
        through = f" (through it {a} reaches {gained})" if gained else ""
        bad.append(
            f"{module}:{imp.line} imports {imp.target} {how}not drawn in {DOC.name}: "
            f"{a} -> {b}{through}"
        )
    assert bad == []


def test_every_exception_is_still_in_use():
    rooms, exceptions = _drawing()
    used = {
        (m.removeprefix("megatron_gamma."), i.target.removeprefix("megatron_gamma."))
        for m, _, i, _ in _cross_room_imports(rooms)
    }
    assert sorted(exceptions.keys() - used) == []


def test_no_import_time_cycle_between_rooms():
    """Module-level imports only (those that run while a module is imported); inside a function
    an import runs later, once every module is loaded."""
    rooms, _ = _drawing()
    graph = {room: set() for room in rooms}
    for _, a, imp, b in _cross_room_imports(rooms):
        if not imp.deferred:
            graph[a].add(b)
    assert cycles(graph) == []


def test_a_room_inside_a_package_stays_apart_from_it():
    """Importing ``training.callback`` runs ``training/__init__.py`` first: that file must import
    nothing of the package, or the room of its own would import the rest of ``training``."""
    rooms, _ = _drawing()
    for room in (r for r in rooms if "." in r):
        parent = PACKAGE.joinpath(*room.split(".")[:-1], "__init__.py")
        assert runtime_imports(parent) == [], f"{parent} imports from the package"


def _third_party_imports(path, package: str) -> list[int]:
    """Lines of ``path`` that import ``package`` or one of its modules (anywhere in the file)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == package or n.startswith(package + ".") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_the_hf_room_imports_transformers():
    """Hugging Face conversion is a room of its own: ``transformers`` (the ``[eval]`` extra) is
    imported by ``megatron_gamma.hf`` and by nothing else of the package."""
    hf = PACKAGE / "hf"
    outside = [
        f"{path}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if hf not in path.parents
        for line in _third_party_imports(path, "transformers")
    ]
    assert outside == []
    assert _third_party_imports(hf / "hf_model.py", "transformers") != []  # the scan sees them
