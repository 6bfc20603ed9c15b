"""Do two runs hold the same SQL? `python scripts/same_sql.py A B` with A and B both an eval
`results.jsonl` (keyed by task_id) or both a training `sql.jsonl` (keyed by step, round, task_id,
sample); `.gz` is read too. Prints how many keys agree on `final_sql` (and on the reward status) and
the first differences; exits 0 only when both files have the same keys and every final SQL agrees."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def read(path: str) -> dict[tuple, dict]:
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if rows and "step" in rows[0]:
        return {(r["step"], r.get("round", 0), r["task_id"], r["sample"]): r for r in rows}
    return {(r["task_id"],): r for r in rows}


def compare(a: dict[tuple, dict], b: dict[tuple, dict]) -> tuple[int, list[str]]:
    """(number of shared keys whose final SQL agrees, lines describing every difference)."""
    diffs = [f"only in A: {k}" for k in sorted(a.keys() - b.keys())]
    diffs += [f"only in B: {k}" for k in sorted(b.keys() - a.keys())]
    same = 0
    for k in sorted(a.keys() & b.keys()):
        if a[k].get("final_sql") == b[k].get("final_sql"):
            same += 1
        else:
            diffs.append(f"{k}: {a[k].get('final_sql')!r} != {b[k].get('final_sql')!r}")
    return same, diffs


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = read(argv[0]), read(argv[1])
    same, diffs = compare(a, b)
    shared = a.keys() & b.keys()
    status = sum(1 for k in shared if a[k].get("status") == b[k].get("status"))
    print(
        f"{argv[0]} vs {argv[1]}: {len(a)} / {len(b)} records; final SQL identical {same}/{len(shared)}; "
        f"status identical {status}/{len(shared)}; differences {len(diffs)}"
    )
    for line in diffs[:10]:
        print("  " + line)
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
