"""Structure figures of a source tree: modules, lines, modules over 600 lines, functions over 150 (the
longest five), module docstrings over 25 lines (as tests/test_structure.py counts them), print() outside cli/.
  python scripts/structure_figures.py src/sqlrl
  git archive f2c8bc1 src | tar x -C /tmp/old && python scripts/structure_figures.py /tmp/old/src/sqlrl
"""

import ast
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
mods = sorted(root.rglob("*.py"))
total = 0
big = []
funcs = []
docs = []
prints = 0
for p in mods:
    t = p.read_text()
    n = t.count("\n")
    total += n
    if n > 600:
        big.append((n, str(p.relative_to(root))))
    tree = ast.parse(t)
    d = ast.get_docstring(tree, clean=False)
    if d and len(d.strip("\n").splitlines()) > 25:
        docs.append((d.count("\n") + 1, str(p.relative_to(root))))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(root)}:{node.name}"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print"
            and "cli" not in p.parts
        ):
            prints += 1
funcs.sort(reverse=True)
print(f"{len(mods)} modules, {total} lines")
print(f"modules over 600 lines: {len(big)}: " + ", ".join(f"{b} {n}" for n, b in sorted(big, reverse=True)))
print(
    f"functions over 150 lines: {sum(1 for n, _ in funcs if n > 150)}; longest: "
    + ", ".join(f"{f} {n}" for n, f in funcs[:5])
)
print(f"module docstrings over 25 lines: {len(docs)}")
print(f"print() calls outside cli: {prints}")
