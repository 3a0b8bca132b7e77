"""The house's import rules (docs/architecture.md), checked on the source:
every import of every module of the package, function-level ones included (read with ast, so
an import hidden in a function body counts like one at the top), must keep the parts in order.

- no import cycle among the package's modules;
- the core imports no plugin (layers, losses), backend, lowering form, trainer, dataset, zoo,
  command line, gate or matplotlib: the registry finds plugins;
- the lowering forms import only the core;
- a layer imports no dataset, trainer or backend; a dataset no trainer or backend; a backend no layer;
- train/ never imports a layer by class (plugins declare themselves by attribute).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "hloforge"

# (importer prefix, imported prefix, why): a module under the first may not import one under the second
NEVER = [
    *(("hloforge.core", p, "the core knows no plugin, backend, trainer, dataset or screen: the registry finds them")
      for p in ("hloforge.plugins", "hloforge.losses", "hloforge.backends", "hloforge.lowering", "hloforge.train",
                "hloforge.datasets", "hloforge.zoo", "hloforge.cli", "hloforge.bench", "hloforge.testing",
                "matplotlib")),
    *(("hloforge.lowering", p, "a lowering form is the core's ops in another order; it knows no plugin")
      for p in ("hloforge.plugins", "hloforge.losses", "hloforge.backends", "hloforge.train", "hloforge.datasets",
                "hloforge.zoo", "hloforge.cli", "hloforge.bench", "matplotlib")),
    *(("hloforge.plugins.layers", p, "a layer knows no dataset, trainer or runtime")
      for p in ("hloforge.datasets", "hloforge.train", "hloforge.backends")),
    *(("hloforge.datasets", p, "data knows no trainer or runtime") for p in ("hloforge.train", "hloforge.backends")),
    ("hloforge.backends", "hloforge.plugins", "a runtime runs text; it knows no layer"),
    ("hloforge.train", "hloforge.plugins.layers", "the trainer finds plugins by registry and attribute, not class"),
    *(("hloforge.train", p, "the loop sits below the commands, the API and the command line")
      for p in ("hloforge.commands", "hloforge.api", "hloforge.callbacks", "hloforge.interop", "hloforge.cli",
                "hloforge.bench")),
    *(("hloforge.core", p, "the core knows no command or API above it")
      for p in ("hloforge.commands", "hloforge.api", "hloforge.callbacks", "hloforge.interop")),
]


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (names for the type checker, never imported)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imported(module: str, source: str, known: dict[str, Path], is_package: bool = False) -> Iterator[str]:
    """Every name `module` (its `source`) imports: a package module where the name (or its `from`
    part) is one, else the outside name as written (`matplotlib.pyplot`)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield sub if sub in known else base


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {}
    for m, path in known.items():
        edges[m] = set()
        for name in imported(m, path.read_text(), known, path.name == "__init__.py"):
            while name and name not in known and name.startswith("hloforge"):
                name = name.rpartition(".")[0]
            if name and name != m:
                edges[m].add(name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue  # outside the package
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# Below the API, nothing imports the top-level package itself: its __init__ is the API's names
# (`hf.Model`, ...), so such an import runs upward (the plugin API version lives with the hooks).
BELOW_THE_API = ("hloforge.core", "hloforge.lowering", "hloforge.plugins", "hloforge.losses", "hloforge.backends",
                 "hloforge.datasets", "hloforge.train")


def wrong_way(edges: dict[str, set[str]]) -> list[str]:
    return sorted([f"{m} imports {t}: {why}" for m, ts in edges.items() for t in ts
                   for src, dst, why in NEVER if _under(m, src) and _under(t, dst)]
                  + [f"{m} imports hloforge: the top-level package is the API above it" for m, ts in edges.items()
                     if "hloforge" in ts and any(_under(m, p) for p in BELOW_THE_API)])


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_no_wrong_way_import() -> None:
    assert wrong_way(graph()) == []


def test_function_level_imports_count() -> None:
    """The walk sees an import inside a function body and a relative one, as a wrong-way arrow."""
    text = "def f():\n    from hloforge.datasets.digits import Digits\n    from ..commands import cam\n"
    names = set(imported("hloforge.core.probe", text, modules()))
    assert {"hloforge.datasets.digits", "hloforge.commands.cam"} <= names
    edges = {"hloforge.core._probe_": {"hloforge.datasets.digits"}}
    assert wrong_way(edges) and "the core knows no plugin" in wrong_way(edges)[0]


@pytest.mark.parametrize("cycle", [["hloforge.core.a", "hloforge.core.b"], ["hloforge.train.x", "hloforge.train.y"]])
def test_a_new_cycle_is_found(cycle: list[str]) -> None:
    a, b = cycle
    assert cycles({a: {b}, b: {a}}) == [{a, b}]


# The parts whose row in docs/architecture.md's table lists, by name, the parts it may import.
LISTED_PARTS = {"core": "hloforge.core", "lowering": "hloforge.lowering", "plugins": "hloforge.plugins",
                "losses": "hloforge.losses", "backends": "hloforge.backends", "datasets": "hloforge.datasets",
                "zoo": "hloforge.zoo", "train": "hloforge.train", "testing": "hloforge.testing"}


def documented_imports() -> dict[str, set[str]]:
    """Each listed part's package -> the packages its row's "may import" cell names."""
    out = {}
    text = (PKG.parent / "docs" / "architecture.md").read_text()
    for row in text.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`hloforge/"):
            continue
        pkg = "hloforge." + cells[1].strip("`/").split("/", 1)[1]
        if pkg in LISTED_PARTS.values():
            words = cells[3].replace(",", " ").split()
            out[pkg] = {LISTED_PARTS[w] for w in words if w in LISTED_PARTS}
    return out


def test_architecture_table_names_what_each_part_imports() -> None:
    """A part importing another its row in docs/architecture.md leaves out: the table misleads whoever adds to it."""
    documented = documented_imports()
    assert set(documented) == set(LISTED_PARTS.values())
    unsaid = set()
    for m, ts in graph().items():
        for pkg, allowed in documented.items():
            if _under(m, pkg):
                unsaid |= {(pkg, p) for t in ts for p in LISTED_PARTS.values()
                           if _under(t, p) and p != pkg and p not in allowed}
    assert sorted(unsaid) == []


def test_architecture_names_every_core_module() -> None:
    """docs/architecture.md walks the core module by module: one left out is a part a newcomer cannot place."""
    text = (PKG.parent / "docs" / "architecture.md").read_text()
    unnamed = [p.name for p in sorted((PKG / "core").glob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in text]
    assert unnamed == []


def test_architecture_names_only_files_that_exist() -> None:
    """Every file or folder docs/architecture.md names in backticks is there: a path the code has moved from
    sends a newcomer looking for nothing (`lowering/<family>.py` is a pattern, `../shared/` outside the repo)."""
    import re

    root = PKG.parent
    text = (root / "docs" / "architecture.md").read_text()
    missing = []
    for token in sorted(set(re.findall(r"`([\w./<>-]+(?:\.py|\.md|\.toml|/))`", text))):
        if "<" in token or token.startswith("../"):
            continue
        if "/" in token:
            found = any((base / token).exists() for base in (root, PKG, PKG / "backends"))
        else:
            found = any(PKG.rglob(token)) or (root / token).exists()
        if not found:
            missing.append(token)
    assert missing == []


def _resolves(dotted: str) -> bool:
    """`hloforge.a.b.C.d` names a module and attributes (an annotated or attrs field counts) that exist."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if name in getattr(obj, "__annotations__", {}) and not hasattr(obj, name):
                return True  # a declared field (an instance's, set in __init__)
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("doc", ["README.md", *(f"docs/{p.name}" for p in sorted((PKG.parent / "docs").glob("*.md")))])
def test_docs_name_only_hloforge_modules_and_attributes_that_exist(doc: str) -> None:
    """Every `hloforge.x.y` a page names (a module, class, function or attribute) is importable as written: one the
    code renamed or moved would send its reader to nothing."""
    import re

    text = (PKG.parent / doc).read_text()
    names = {n.rstrip(".") for n in re.findall(r"\bhloforge(?:\.[A-Za-z_]\w*)+", text)}
    assert sorted(n for n in names if not _resolves(n)) == []


def test_architecture_names_every_package() -> None:
    """Every package under hloforge/ is named in docs/architecture.md as a folder (`hloforge/train/`, or the tail of
    one, `xla/pjrt/`), so a newcomer can find each from the page."""
    import re

    folders = set(re.findall(r"`([\w/]+/)`", (PKG.parent / "docs" / "architecture.md").read_text()))
    packages = [p.parent.relative_to(PKG.parent).as_posix() + "/" for p in PKG.rglob("__init__.py") if p.parent != PKG]
    assert sorted(p for p in packages if not any(p.endswith(f) for f in folders)) == []
