"""Official Spider hardness distribution of the golds of a Spider folder's example files.

    python scripts/hardness.py DATA_DIR [FILE ...]

FILE: example files of DATA_DIR (default: train_spider.json and train_others.json, those present).
Prints, per file and in total, how many golds fall in each class (easy / medium / hard / extra, by
`sqlrl.tasks.hardness`, the official evaluation.py rules) and how many sqlglot cannot parse. Exit 2
when DATA_DIR or a FILE is missing or not a JSON list of examples with a "query".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from sqlrl.tasks.hardness import HARDNESS, UNPARSED, hardness


def _line(name: str, c: Counter) -> str:
    n = sum(c.values())
    parts = [f"{k} {c.get(k, 0)} ({100 * c.get(k, 0) / n:.1f}%)" for k in HARDNESS] if n else []
    if c.get(UNPARSED):
        parts.append(f"{UNPARSED} {c[UNPARSED]}")
    return f"{name}: {n} golds: " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="Spider folder (official layout)")
    ap.add_argument("files", nargs="*", help="example files (default: train_spider.json, train_others.json)")
    a = ap.parse_args(argv)
    root = Path(a.data)
    names = a.files or [f for f in ("train_spider.json", "train_others.json") if (root / f).is_file()]
    if not root.is_dir() or not names:
        print(
            f"hardness.py: {root} is not a folder with example files; pass a Spider folder", file=sys.stderr
        )
        return 2
    total: Counter = Counter()
    for name in names:
        try:
            examples = json.loads((root / name).read_text(encoding="utf-8"))
            golds = [e["query"] for e in examples]
        except (OSError, ValueError, TypeError, KeyError) as e:
            print(
                f"hardness.py: {root / name}: not a JSON list of examples with a query ({e})", file=sys.stderr
            )
            return 2
        c = Counter(hardness(g) or UNPARSED for g in golds)
        total += c
        print(_line(name, c))
    if len(names) > 1:
        print(_line("total", total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
