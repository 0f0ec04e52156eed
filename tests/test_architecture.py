"""The import contracts of ``fleet_tui``, checked on the source with ``ast``.

Why: three rules keep the code readable from its folders, and each was only a habit until now:

- **the engine never imports the UI**: nothing on the engine side (``scheduler/``, ``coders/``,
  ``notify/`` and the top-level modules other than the CLI entry points) imports ``textual`` or
  ``rich``, nor reaches them through another ``fleet_tui`` module;
- **only the store modules know SQL**: outside ``scheduler/store/`` no module imports a database
  driver or holds an SQL statement;
- **no import cycles** between ``fleet_tui`` modules.

Every import counts: at module level, under ``if TYPE_CHECKING:`` and inside functions (a lazy
import is still a dependency, merely a hidden one). Reading the source rather than importing it
sees all three kinds, needs no dependency, and names the file and line of each offence.
The checkers take any package directory, so the last tests plant a violation in a small tree
under ``tmp_path`` and show each checker catches it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "fleet_tui"

UI_LIBRARIES = frozenset({"textual", "rich"})
# the cockpit, and the programs that start it (launcher.py is the one module that puts the engine
# and the Textual app together; the CLI calls it); everything else in the package is engine side
UI_PACKAGES = ("app", "screens")
UI_ENTRY_POINTS = ("launcher", "cli", "cli_context", "__main__", "wheel_cli")

SQL_DRIVERS = frozenset({"sqlite3", "psycopg", "psycopg2", "psycopg_pool", "asyncpg"})
SQL_HOME = "scheduler.store"
SQL_STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA)\s")
# Modules outside scheduler/store that know SQL today, each with why; the list may only shrink
# (an entry that no longer offends fails the test so it gets removed).
SQL_ALLOWED: frozenset[str] = frozenset()

# Import cycles that exist today (strongly connected components of the module graph, by module
# name relative to ``fleet_tui``). The list may only shrink: a new cycle fails, and so does an
# entry that is gone or has changed (replace it with what the test reports).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to an absolute dotted name."""

    target: str
    line: int


@dataclass(frozen=True)
class Module:
    """A module of the scanned package: its name relative to the package, file and imports."""

    name: str
    path: Path
    tree: ast.Module

    @property
    def imports(self) -> list[Import]:
        return list(_imports(self))


def scan(package: Path) -> dict[str, Module]:
    """Every module under ``package`` by its name relative to it (``scheduler.engine``;
    a package's ``__init__`` is the package's own name, the top one is ``""``)."""
    out: dict[str, Module] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        out[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return out


def _imports(mod: Module) -> Iterator[Import]:
    """Each import anywhere in the module (``ast.walk`` enters functions and ``if`` blocks),
    absolute, with the top package spelled ``@`` so relative and absolute imports agree."""
    is_package = mod.path.name == "__init__.py"
    here = ["@", *mod.name.split(".")] if mod.name else ["@"]
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            for alias in node.names:
                yield Import(f"{prefix}.{alias.name}", node.lineno)


def _internal(target: str, top: str, modules: Iterable[str]) -> str | None:
    """The scanned module an import target lands on (``from a import b`` may name module ``a.b``
    or a name in ``a``), or None when it is outside the package."""
    parts = target.split(".")
    if parts[0] == top:
        parts[0] = "@"
    if parts[0] != "@":
        return None
    names = set(modules)
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[1:n])
        if name in names:
            return name
    return None


def graph(package: Path) -> dict[str, set[str]]:
    """The module graph of ``package``: each module to the package modules it imports."""
    mods = scan(package)
    top = package.name
    edges: dict[str, set[str]] = {name: set() for name in mods}
    for name, mod in mods.items():
        for imp in mod.imports:
            dest = _internal(imp.target, top, mods)
            if dest is not None and dest != name:
                edges[name].add(dest)
    return edges


def _top_level(target: str) -> str:
    return target.split(".")[0]


def _is_ui(name: str) -> bool:
    head = name.split(".")[0]
    return head in UI_PACKAGES or name in UI_ENTRY_POINTS


def ui_violations(package: Path) -> list[str]:
    """Each engine-side module that imports textual/rich or a UI module, directly or through
    other package modules, as ``module: chain -> offence (file:line)``."""
    mods = scan(package)
    edges = graph(package)
    direct: dict[str, str] = {}
    for name, mod in mods.items():
        for imp in mod.imports:
            if _top_level(imp.target) in UI_LIBRARIES:
                direct.setdefault(name, f"{imp.target} ({mod.path.relative_to(package)}:{imp.line})")
    found = []
    for start in sorted(n for n in mods if not _is_ui(n)):
        # breadth first, so the reported chain is a shortest one
        via: dict[str, str | None] = {start: None}
        queue = [start]
        while queue:
            cur = queue.pop(0)
            offence = f"ui module {cur}" if _is_ui(cur) else direct.get(cur)
            if offence:
                chain = [cur]
                while (prev := via[chain[-1]]) is not None:
                    chain.append(prev)
                found.append(f"{start}: {' -> '.join(reversed(chain))} -> {offence}")
                break
            for nxt in sorted(edges[cur]):
                if nxt not in via:
                    via[nxt] = cur
                    queue.append(nxt)
    return found


def sql_violations(package: Path, home: str = SQL_HOME) -> dict[str, list[str]]:
    """Modules outside ``home`` that import a database driver or hold an SQL statement, each
    with its offences as ``file:line: what``."""
    found: dict[str, list[str]] = {}
    for name, mod in scan(package).items():
        if name == home or name.startswith(home + "."):
            continue
        rel = mod.path.relative_to(package)
        hits = [
            f"{rel}:{i.line}: import {i.target}" for i in mod.imports if _top_level(i.target) in SQL_DRIVERS
        ]
        for node in ast.walk(mod.tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(node, ast.Constant) and isinstance(text, str) and SQL_STATEMENT.match(text):
                hits.append(f"{rel}:{node.lineno}: {text.strip().splitlines()[0][:60]!r}")
        if hits:
            found[name] = hits
    return found


def cycles(package: Path) -> set[frozenset[str]]:
    """The import cycles of ``package``: its module graph's strongly connected components of more
    than one module (Tarjan's algorithm, iterative so deep graphs do not hit the recursion limit)."""
    edges = graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[frozenset[str]] = set()
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.add(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        out.add(frozenset(comp))
    return out


def _show(cycle: frozenset[str]) -> str:
    return "{" + ", ".join(sorted(cycle)) + "}"


# --- the contracts, on the real package ---------------------------------------------------------


def test_the_package_is_scanned_whole() -> None:
    mods = scan(PACKAGE)
    assert len(mods) > 80
    for name in ("scheduler.engine", "scheduler.store.sqlite_store", "coders.base", "app.app", "cli"):
        assert name in mods, name


def test_the_engine_imports_no_ui() -> None:
    assert ui_violations(PACKAGE) == []


def test_importing_the_whole_engine_side_loads_no_ui() -> None:
    # the same rule at run time, in a fresh interpreter: it also sees a third-party library that
    # would pull rich in behind the engine's back
    names = sorted(f"fleet_tui.{n}" if n else "fleet_tui" for n in scan(PACKAGE) if not _is_ui(n))
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(UI_LIBRARIES)!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_only_the_store_modules_know_sql() -> None:
    found = sql_violations(PACKAGE)
    new = {name: hits for name, hits in found.items() if name not in SQL_ALLOWED}
    assert new == {}, "SQL outside scheduler/store: move it behind the Store protocol"
    gone = SQL_ALLOWED - found.keys()
    assert not gone, f"no longer know SQL, remove from SQL_ALLOWED: {sorted(gone)}"


def test_the_store_modules_do_know_sql() -> None:
    # the heuristic sees real statements: without the exemption the store would offend
    found = sql_violations(PACKAGE, home="no.such.package")
    assert "scheduler.store.sqlite_base" in found
    assert "scheduler.store.postgres_schema" in found or "scheduler.store.postgres_store" in found


def cycle_report(found: set[frozenset[str]], known: frozenset[frozenset[str]]) -> list[str]:
    """What differs between the cycles found and the known ones, one line each: a new cycle, a
    known one that shrank (a part of it was untangled) or one that is gone."""
    lines = []
    for c in sorted(found - known, key=sorted):
        wider = [k for k in known if c < k]
        if wider:
            lines.append(f"shrank, replace {_show(wider[0])} in KNOWN_CYCLES with {_show(c)}")
        else:
            lines.append(f"new import cycle: {_show(c)}")
    for k in sorted(known - found, key=sorted):
        if not any(c < k for c in found):
            lines.append(f"gone, remove from KNOWN_CYCLES: {_show(k)}")
    return lines


def test_no_import_cycles_beyond_the_known_ones() -> None:
    lines = cycle_report(cycles(PACKAGE), KNOWN_CYCLES)
    assert not lines, "\n".join(lines)


# --- each checker catches a planted violation ------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "fleet_tui"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for d in [pkg, *(p for p in pkg.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    return pkg


def test_the_ui_checker_catches_direct_lazy_typing_and_transitive_imports(tmp_path: Path) -> None:
    pkg = _tree(
        tmp_path,
        {
            "scheduler/clean.py": "import json\nfrom fleet_tui.scheduler import model\n",
            "scheduler/model.py": "from dataclasses import dataclass\n",
            "scheduler/direct.py": "from rich.text import Text\n",
            "scheduler/lazy.py": "def f() -> None:\n    import textual.app\n",
            "scheduler/typing_only.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from textual.widget import Widget\n"
            ),
            "coders/relative.py": "from ..app import panes\n",
            "notify/chain.py": "from fleet_tui.scheduler import direct\n",
            "app/panes.py": "import textual\n",
            "cli.py": "import rich\nfrom fleet_tui.app import panes\n",
        },
    )
    found = ui_violations(pkg)
    offenders = sorted(line.split(":")[0] for line in found)
    assert offenders == [
        "coders.relative",
        "notify.chain",
        "scheduler.direct",
        "scheduler.lazy",
        "scheduler.typing_only",
    ], found
    chain = next(line for line in found if line.startswith("notify.chain"))
    assert "notify.chain -> scheduler.direct -> rich.text.Text (scheduler/direct.py:1)" in chain


def test_the_sql_checker_catches_drivers_and_statements(tmp_path: Path) -> None:
    pkg = _tree(
        tmp_path,
        {
            "scheduler/store/sqlite_store.py": 'import sqlite3\nQ = "SELECT id FROM tasks"\n',
            "scheduler/engine.py": "def f() -> None:\n    import sqlite3\n",
            "scheduler/view.py": (
                'def q(t: str) -> str:\n    return f"""\n  UPDATE tasks SET x = 1 WHERE id = {t}"""\n'
            ),
            "scheduler/typed.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from psycopg import Connection\n"
            ),
            "app/prose.py": 'HELP = "Update the task. Select a row; create a new one; delete it."\n',
        },
    )
    found = sql_violations(pkg)
    assert sorted(found) == ["scheduler.engine", "scheduler.typed", "scheduler.view"], found
    assert found["scheduler.engine"] == ["scheduler/engine.py:2: import sqlite3"]
    assert found["scheduler.view"][0].startswith("scheduler/view.py:2: 'UPDATE tasks")


def test_the_cycle_checker_catches_typing_and_lazy_cycles(tmp_path: Path) -> None:
    pkg = _tree(
        tmp_path,
        {
            # a three-module ring closed by a function-level import
            "scheduler/a.py": "from fleet_tui.scheduler import b\n",
            "scheduler/b.py": "from . import c\n",
            "scheduler/c.py": "def f() -> None:\n    from fleet_tui.scheduler.a import thing\n",
            # a pair closed only under TYPE_CHECKING
            "x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fleet_tui.y import Y\n",
            "y.py": "import fleet_tui.x\n",
            # a chain without a cycle, and a package importing its own module
            "p/q.py": "from fleet_tui import x\n",
            "p/__init__.py": "from .q import thing\n",
        },
    )
    found = cycles(pkg)
    assert found == {frozenset({"scheduler.a", "scheduler.b", "scheduler.c"}), frozenset({"x", "y"})}
    # against an allowlist: a known cycle passes, a new one fails, a shrunk or gone one asks to
    # update the list
    abc = frozenset({"scheduler.a", "scheduler.b", "scheduler.c"})
    assert cycle_report(found, frozenset({abc, frozenset({"x", "y"})})) == []
    assert cycle_report(found, frozenset({abc})) == ["new import cycle: {x, y}"]
    wider = frozenset({*abc, "scheduler.d"})
    assert cycle_report(found, frozenset({wider, frozenset({"x", "y"}), frozenset({"p", "q"})})) == [
        "shrank, replace {scheduler.a, scheduler.b, scheduler.c, scheduler.d} in KNOWN_CYCLES with "
        "{scheduler.a, scheduler.b, scheduler.c}",
        "gone, remove from KNOWN_CYCLES: {p, q}",
    ]
