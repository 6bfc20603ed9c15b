"""Plausible bugs in a SELECT, for building query and personalization debugging tasks.

`mutate_query(sql, columns, rng)` returns (buggy_sql, kind) for one of `MUTATION_KINDS`: a swapped
column (of the same numeric/non-numeric type), a swapped aggregate or COUNT(DISTINCT), a dropped
WHERE condition, a flipped comparison, a flipped ORDER BY direction, a LIMIT off by one, a dropped
DISTINCT, or a swapped join key.

What is covered:
- the kinds are tried in an rng-shuffled order; the first whose output parses (sqlglot, sqlite) and
  differs from the normalized input wins; same inputs and rng state -> the same answer.

What is not:
- that the mutated query gives a different result: the builder validates each task by running it.
- sqlglot is imported on first use.
"""

from __future__ import annotations

import random

__all__ = ["MUTATION_KINDS", "mutate_query", "numeric_type"]

MUTATION_KINDS = (
    "wrong_column",
    "wrong_aggregate",
    "drop_condition",
    "comparison",
    "order_direction",
    "limit_off_by_one",
    "drop_distinct",
    "wrong_join_key",
)


def numeric_type(typ: str) -> bool:
    """Whether a declared (upper-cased) SQLite column type is numeric."""
    return any(k in typ for k in ("INT", "REAL", "NUM", "DEC", "FLOA", "DOUB"))


def mutate_query(
    sql: str,
    columns: dict[str, list[tuple[str, str]]],
    rng: random.Random,
    kinds: tuple[str, ...] = MUTATION_KINDS,
) -> tuple[str, str] | None:
    """One plausible bug in a SELECT: returns (buggy_sql, kind) or None when no mutation applies.

    Tries the kinds in an rng-shuffled order; the result parses and differs from the normalized input.
    """
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
        base = tree.sql(dialect="sqlite")
    except Exception:
        return None
    if not isinstance(tree, exp.Select):
        return None
    order = list(kinds)
    rng.shuffle(order)
    for kind in order:
        t = tree.copy()
        if not _apply_mutation(t, kind, columns, rng, exp):
            continue
        try:
            out = t.sql(dialect="sqlite")
            sqlglot.parse_one(out, read="sqlite")
        except Exception:
            continue
        if out != base:
            return out, kind
    return None


def _alias_map(t, exp) -> dict[str, str]:
    m = {}
    for tb in t.find_all(exp.Table):
        m[tb.alias_or_name.lower()] = tb.name.lower()
        m[tb.name.lower()] = tb.name.lower()
    return m


def _resolve_table(col, amap, columns, exp) -> str | None:
    if col.table:
        return amap.get(col.table.lower())
    tables = sorted(set(amap.values()))
    owners = [tb for tb in tables if any(c.lower() == col.name.lower() for c, _ in columns.get(tb, []))]
    return owners[0] if len(owners) == 1 else None


def _swap_column(col, columns, amap, rng, exp, prefer_key: bool = False) -> bool:
    tb = _resolve_table(col, amap, columns, exp)
    if tb is None or tb not in columns:
        return False
    mine = [c for c in columns[tb] if c[0].lower() == col.name.lower()]
    if not mine:
        return False
    typ = mine[0][1]
    cands = [
        c for c, ty in columns[tb] if c.lower() != col.name.lower() and numeric_type(ty) == numeric_type(typ)
    ]
    if prefer_key:
        keyish = [c for c in cands if "id" in c.lower() or "code" in c.lower() or "num" in c.lower()]
        cands = keyish or cands
    if not cands:
        return False
    new = rng.choice(sorted(cands))
    col.set("this", exp.to_identifier(new, quoted=not new.replace("_", "").isalnum() or " " in new))
    return True


def _apply_mutation(t, kind, columns, rng, exp) -> bool:  # noqa: C901 - a flat dispatch
    amap = _alias_map(t, exp)
    if kind == "wrong_column":
        cols = [
            c
            for c in t.find_all(exp.Column)
            if not isinstance(c.this, exp.Star) and c.find_ancestor(exp.Join) is None
        ]
        rng.shuffle(cols)
        return any(_swap_column(c, columns, amap, rng, exp) for c in cols[:4])
    if kind == "wrong_join_key":
        eqs = [j.args.get("on") for j in t.find_all(exp.Join) if isinstance(j.args.get("on"), exp.EQ)]
        if not eqs:
            return False
        eq = rng.choice(eqs)
        sides = [s for s in (eq.this, eq.expression) if isinstance(s, exp.Column)]
        rng.shuffle(sides)
        return any(_swap_column(c, columns, amap, rng, exp, prefer_key=True) for c in sides)
    if kind == "wrong_aggregate":
        swaps = {exp.Max: exp.Min, exp.Min: exp.Max, exp.Avg: exp.Sum, exp.Sum: exp.Avg}
        aggs = [a for a in t.find_all(exp.Max, exp.Min, exp.Avg, exp.Sum)]
        cnts = [a for a in t.find_all(exp.Count) if not isinstance(a.this, exp.Star) and a.this is not None]
        if not aggs and not cnts:
            return False
        node = rng.choice(aggs + cnts)
        if isinstance(node, exp.Count):
            if isinstance(node.this, exp.Distinct):
                node.set("this", node.this.expressions[0].copy())
            else:
                node.set("this", exp.Distinct(expressions=[node.this.copy()]))
            return True
        node.replace(swaps[type(node)](this=node.this.copy()))
        return True
    if kind == "drop_condition":
        where = t.args.get("where")
        ands = [a for a in t.find_all(exp.And) if a.find_ancestor(exp.Where) is where and where is not None]
        if ands:
            a = rng.choice(ands)
            a.replace((a.this if rng.random() < 0.5 else a.expression).copy())
            return True
        if where is not None and not list(where.find_all(exp.Select)):
            t.set("where", None)
            return True
        return False
    if kind == "comparison":
        swaps = {exp.GT: exp.GTE, exp.GTE: exp.GT, exp.LT: exp.LTE, exp.LTE: exp.LT, exp.EQ: exp.NEQ}
        nodes = [n for n in t.find_all(exp.GT, exp.GTE, exp.LT, exp.LTE) if n.find_ancestor(exp.Join) is None]
        if not nodes:
            nodes = [
                n
                for n in t.find_all(exp.EQ)
                if n.find_ancestor(exp.Where) is not None and not isinstance(n.expression, exp.Column)
            ]
        if not nodes:
            return False
        n = rng.choice(nodes)
        n.replace(swaps[type(n)](this=n.this.copy(), expression=n.expression.copy()))
        return True
    if kind == "order_direction":
        ords = list(t.find_all(exp.Ordered))
        if not ords:
            return False
        o = rng.choice(ords)
        o.set("desc", not o.args.get("desc"))
        return True
    if kind == "limit_off_by_one":
        lim = t.args.get("limit")
        if lim is None or not isinstance(lim.expression, exp.Literal) or not lim.expression.is_int:
            return False
        n = int(lim.expression.this)
        new = n + 1 if (n <= 1 or rng.random() < 0.5) else n - 1
        lim.set("expression", exp.Literal.number(new))
        return True
    if kind == "drop_distinct":
        if t.args.get("distinct") is not None:
            t.set("distinct", None)
            return True
        return False
    return False
