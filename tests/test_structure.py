"""The package's shape: no import cycle, no stage importing a later one, sizes a reader can hold.

The graph is read with `ast` from every module under src/sqlrl, imports inside functions included
(they execute on first call, so they close cycles as surely as top-level ones). String imports
(`importlib.import_module`, the CLI's command table, the public API's lazy attributes) are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# The pipeline, lowest stage first. A module may import its own package and any earlier stage.
STAGES: list[tuple[str, ...]] = [
    (
        "version",
        "config",
        "config_budgets",
        "config_tables",
        "artifacts",
    ),  # the floor: no sqlrl imports but each other
    ("sql",),  # hardened execution: guard, worker pool, read-only sandbox, writable replicas
    ("tasks",),  # task layouts, gold cache, debugging tasks
    ("reward",),  # match semantics and the evaluator
    ("agent",),  # prompts, parser, the rollout loop, environments
    ("generation",),  # model sources, policies, decode engines
    ("evaluation",),  # a policy over a split, scored
    ("training",),  # GRPO maths, the update, the step loop, checkpoints, SFT, curriculum
    ("evidence",),  # run-folder reader, stats, audits, gate, seeds, report
    ("experiment", "integrations"),  # the arm matrix; external engines (veRL, Agent Lightning)
    ("cli",),  # argparse lives here and nowhere else
    ("",),  # sqlrl/__init__.py: the public API (lazy)
]


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(src: Path = SRC, package: str = "sqlrl") -> dict[str, set[str]]:
    """module -> modules it imports (within `package`), from every import statement in the file."""
    files = {module_name(p, src): p for p in (src / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in files else base)
            for t in targets:
                # `import sqlrl.a.b` runs sqlrl.a.b; the edge goes to the deepest module that exists
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def stage_of(mod: str, package: str = "sqlrl") -> int:
    rest = mod[len(package) + 1 :] if mod != package else ""
    head = rest.split(".")[0]
    for i, names in enumerate(STAGES):
        if head in names:
            return i
    raise KeyError(f"{mod}: in no stage; add its package to STAGES in {Path(__file__).name}")


def upward_imports(graph: dict[str, set[str]], package: str = "sqlrl") -> list[str]:
    """Edges from a module to one of a later stage, or to another package of the same stage."""
    bad = []
    for a, targets in graph.items():
        for b in targets:
            sa, sb = stage_of(a, package), stage_of(b, package)
            top = lambda m: m.split(".")[1] if m.count(".") else ""  # noqa: E731
            if sb > sa or (sb == sa and sa != 0 and top(a) != top(b)):
                bad.append(f"{a} (stage {sa}) imports {b} (stage {sb})")
    return sorted(bad)


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_no_stage_imports_a_later_one():
    assert upward_imports(import_graph()) == []


def test_every_module_is_in_a_stage():
    for mod in import_graph():
        stage_of(mod)


def test_argparse_only_in_the_cli():
    users = [
        m for m, p in _files().items() if "argparse" in _imported_stdlib(p) and not m.startswith("sqlrl.cli")
    ]
    assert users == []


def _files() -> dict[str, Path]:
    return {module_name(p): p for p in (SRC / "sqlrl").rglob("*.py")}


def _imported_stdlib(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


# ---------------------------------------------------------------- the checker catches what it should


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / "pkg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "sql/__init__.py": "",
            "sql/a.py": "def f():\n    from pkg.tasks import b\n",
            "tasks/__init__.py": "",
            "tasks/b.py": "from pkg.sql.a import f\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.sql.a"] == {"pkg.tasks.b"}
    assert find_cycle(graph) == ["pkg.sql.a", "pkg.tasks.b", "pkg.sql.a"]
    assert upward_imports(graph, "pkg") == ["pkg.sql.a (stage 1) imports pkg.tasks.b (stage 2)"]


def test_checker_resolves_relative_and_package_imports(tmp_path):
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "config.py": "",
            "agent/__init__.py": "",
            "agent/loop.py": "from . import prompts\nfrom ..config import x\nimport pkg.reward.match as m\n",
            "agent/prompts.py": "",
            "reward/__init__.py": "",
            "reward/match.py": "from pkg import config\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.agent.loop"] == {"pkg.agent.prompts", "pkg.config", "pkg.reward.match"}
    assert graph["pkg.reward.match"] == {"pkg.config"}
    assert find_cycle(graph) is None
    assert upward_imports(graph, "pkg") == []


def test_checker_refuses_a_sibling_package_of_the_same_stage():
    graph = {"sqlrl.experiment.matrix": {"sqlrl.integrations.verl"}, "sqlrl.integrations.verl": set()}
    assert upward_imports(graph) == [
        "sqlrl.experiment.matrix (stage 9) imports sqlrl.integrations.verl (stage 9)"
    ]


def test_unknown_package_is_named():
    with pytest.raises(KeyError, match="sqlrl.nowhere.x: in no stage"):
        stage_of("sqlrl.nowhere.x")


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # e.g. optional imports
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Assign):
                    names |= {n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def unresolved_imports(src: Path = SRC, roots: tuple[Path, ...] = (), package: str = "sqlrl") -> list[str]:
    """`from sqlrl.x import name` where sqlrl.x defines no `name` and has no submodule `name` (imports
    inside functions included: they fail only when the function runs)."""
    files = {module_name(p, src): p for p in (src / package).rglob("*.py")}
    bad = []
    for path in [*files.values(), *(p for r in roots for p in r.rglob("*.py"))]:
        tree = ast.parse(path.read_text(), str(path))
        bad += _unresolved_attributes(tree, path, files)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and not node.level and node.module):
                continue
            if node.module.split(".")[0] != package:
                continue
            if node.module not in files:
                bad.append(f"{path}:{node.lineno}: no module {node.module}")
                continue
            defined = _top_level_names(files[node.module])
            lazy = "__getattr__" in defined
            for a in node.names:
                if a.name not in defined and f"{node.module}.{a.name}" not in files and not lazy:
                    bad.append(f"{path}:{node.lineno}: {node.module} has no {a.name}")
    return bad


def _unresolved_attributes(tree: ast.AST, path: Path, files: dict[str, Path]) -> list[str]:
    """`X.name` where X is a module alias (`from sqlrl.a import b as X`, `import sqlrl.a.b as X`) and
    module sqlrl.a.b defines no `name`."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if f"{node.module}.{a.name}" in files:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in files:
                    aliases[a.asname] = a.name
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            mod = aliases[node.value.id]
            defined = _top_level_names(files[mod]) | {
                "__file__",
                "__name__",
                "__path__",
                "__spec__",
                "__doc__",
            }
            if "__getattr__" in defined:  # a lazy module: ast cannot see all its attributes
                continue
            if (
                isinstance(node.ctx, ast.Load)
                and node.attr not in defined
                and f"{mod}.{node.attr}" not in files
            ):
                bad.append(f"{path}:{node.lineno}: {mod} has no {node.attr}")
    return bad


def test_every_sqlrl_import_resolves():
    root = SRC.parent
    assert unresolved_imports(roots=(root / "tests", root / "bench", root / "scripts")) == []


def test_checker_finds_an_import_of_a_moved_name(tmp_path):
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "def f():\n    pass\n",
            "b.py": "def g():\n    from pkg.a import f, gone\n    from pkg.nowhere import x\n    import pkg.a as A\n    A.f(), A.moved()\n",
        },
    )
    assert unresolved_imports(src, package="pkg") == [
        f"{src / 'pkg' / 'b.py'}:5: pkg.a has no moved",
        f"{src / 'pkg' / 'b.py'}:2: pkg.a has no gone",
        f"{src / 'pkg' / 'b.py'}:3: no module pkg.nowhere",
    ]


# ---------------------------------------------------------------- sizes a reader can hold

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 150
MAX_DOCSTRING_LINES = 25


def size_problems(src: Path = SRC, package: str = "sqlrl") -> list[str]:
    """Modules over MAX_MODULE_LINES, functions (methods too, from `def` to their last line) over
    MAX_FUNCTION_LINES, module docstrings over MAX_DOCSTRING_LINES, and print() outside the CLI."""
    bad = []
    for path in sorted((src / package).rglob("*.py")):
        rel = path.relative_to(src)
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            bad.append(f"{rel}: {n} lines")
        tree = ast.parse(text)
        doc = ast.get_docstring(tree, clean=False)
        if doc and (n := len(doc.strip("\n").splitlines())) > MAX_DOCSTRING_LINES:
            bad.append(f"{rel}: module docstring {n} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    bad.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "print"
                and rel.parts[1] != "cli"
            ):
                bad.append(f"{rel}:{node.lineno}: print() in the library (use logging)")
    return bad


def test_sizes_a_reader_can_hold():
    assert size_problems() == []


def test_size_checker_counts_what_it_says(tmp_path):
    long_fn = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES  # def line + body = limit + 1
    doc = '"""' + "line\n" * MAX_DOCSTRING_LINES + 'one too many"""\n'
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": doc + long_fn + "print('x')\n",
            "b.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
            "cli/__init__.py": "print('fine here')\n",
            "ok.py": '"""' + "l\n" * (MAX_DOCSTRING_LINES - 1) + 'last"""\n' + "def g():\n    pass\n",
        },
    )
    assert size_problems(src, "pkg") == [
        "pkg/a.py: module docstring 26 lines",
        f"pkg/a.py:{MAX_DOCSTRING_LINES + 2} f: {MAX_FUNCTION_LINES + 1} lines",
        f"pkg/a.py:{MAX_DOCSTRING_LINES + 2 + MAX_FUNCTION_LINES + 1}: print() in the library (use logging)",
        f"pkg/b.py: {MAX_MODULE_LINES + 1} lines",
    ]
