"""The code's shape: the layers (import-linter's contracts in pyproject.toml), function length, no
import cycles.

The length and cycle checks are static, with ast over the repository's own .py files (no module is
imported), so they are fast; imports are counted at every level, module level and inside functions.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60
SKIPPED = ("tests", ".venv", "models/train/runs")  # not checked: tests, the environment, training outputs


def source_files() -> list[Path]:
    """Every project .py file outside SKIPPED, hidden folders and caches."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT)
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d != "__pycache__" and (rel / d).as_posix() not in SKIPPED
        )
        found += [Path(folder) / f for f in sorted(files) if f.endswith(".py")]
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in source_files()}


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imported_names(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of everything `path` imports, relative imports resolved.

    `from pkg import name` is `pkg.name` when that is a project module file, else `pkg`.
    """
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                base_parts = base_parts[: len(base_parts) - (node.level - 1)] if node.level > 1 else base_parts
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                yield node.lineno, full if full in modules() else base


def test_the_layers_contract_holds():
    """The import-linter contracts of pyproject.toml (the layers ui | webapi -> engine -> serving ->
    pipelines -> devices -> config, gradio only in ui, no tool imported by the app): kept, or this fails with
    import-linter's report of every import that breaks one."""
    import contextlib
    import io

    import tomllib
    from importlinter.cli import lint_imports

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    assert layers == ["ui | webapi", "engine", "serving", "pipelines", "devices", "config"]  # ui, webapi: independent
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    assert code == 0, report.getvalue()


def test_no_function_longer_than_60_lines():
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in source_files()
        for node in sorted(ast.walk(tree(path)), key=lambda n: getattr(n, "lineno", 0))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert offenders == [], f"functions longer than {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def import_graph() -> dict[str, dict[str, int]]:
    """Project module -> {project module it imports: first line}. `from pkg import name` is pkg.name when
    that is a module file, else pkg; `import a.b.c` is the longest prefix that is a project module."""
    known = modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        for line, target in imported_names(path):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name][target] = min(line, graph[name].get(target, line))
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def test_no_import_cycles():
    graph = import_graph()
    cycles = sorted(c for c in strongly_connected(graph) if len(c) > 1)
    lines = [
        " <-> ".join(c)
        + "   ["
        + "; ".join(
            f"{modules()[a].relative_to(ROOT)}:{graph[a][b]} imports {b}" for a in c for b in sorted(graph[a]) if b in c
        )
        + "]"
        for c in cycles
    ]
    assert cycles == [], "import cycles (imports at any level):\n" + "\n".join(lines)


def test_the_schema_loads_no_runtime():
    """`import pipelines.schema` (and the face, `import pipelines`) is torch-free: a thin front end can read,
    validate and document a request without torch, diffusers or transformers (import-linter forbids the
    imports; this checks what a fresh interpreter really loads, lazy imports of the face included)."""
    import subprocess
    import sys

    code = (
        "import sys, pipelines, pipelines.schema, pipelines.schema.request, pipelines.schema.cli, pipelines.schema.docs\n"
        "from pipelines.schema.request import GenerationRequest\n"
        "GenerationRequest(prompt='a cat', steps=3)\n"
        "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers', 'accelerate', 'devices') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing the schema loaded {out.stdout.strip()}"


def test_the_face_contract_names_every_room_and_the_face_resolves():
    """The one-face contract forbids every room of pipelines but the schema (a new room is covered the day
    it is added, or this fails), and every name the face offers loads from its room."""
    import tomllib

    import pipelines

    contract = next(
        c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
        if c["name"].startswith("One face")
    )
    inner = {
        f"pipelines.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "pipelines").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert set(contract["forbidden_modules"]) == inner - {"pipelines.schema"}
    assert set(contract["source_modules"]) == {"ui", "webapi", "engine", "serving"}
    missing = [name for name in pipelines.__all__ if getattr(pipelines, name, None) is None]
    assert missing == [], f"face names that do not resolve: {missing}"


def test_rooms_say_what_they_own_and_stay_small():
    """Every package and module of the app's layers has a docstring (the architecture page's table is made
    of their first lines); no module in pipelines/ is over 600 lines and no class over 400."""
    from tests.architecture_page import PACKAGES, docstring, modules

    undocumented = [name for package in PACKAGES for name, path in modules(package) if not docstring(path)]
    assert undocumented == [], f"modules without a docstring: {undocumented}"
    long_modules = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in sorted((ROOT / "pipelines").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 600
    ]
    long_classes = [
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for p in source_files()
        for node in ast.walk(tree(p))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 400
    ]
    assert long_modules == [] and long_classes == [], long_modules + long_classes


def test_the_architecture_page_is_generated_from_the_code():
    """docs/architecture.md's layer picture and module table are what `python -m tests.architecture_page`
    writes from pyproject.toml's contracts and the modules' docstrings: a moved module, a new room or a
    changed docstring without the page regenerated fails here."""
    from tests.architecture_page import PAGE, page

    assert PAGE.read_text(encoding="utf-8") == page(), "docs/architecture.md is stale: run python -m tests.architecture_page"
