"""Spider hardness (easy / medium / hard / extra) of a gold SQL, as the official Spider evaluation.py.

A port of `Evaluator.eval_hardness` (spider/evaluation.py) onto sqlglot's parse (sqlite dialect). On
the top-level query only (a nested query counts as one, whatever it holds):
- component1 = [WHERE] + [GROUP BY] + [ORDER BY] + [LIMIT] + (FROM table units - 1) + the ORs and the
  LIKE conditions (NOT LIKE too) of the JOIN ON, WHERE and HAVING conditions;
- component2 = subqueries that are an operand of a JOIN ON / WHERE / HAVING condition, + 1 when the
  query is followed by INTERSECT / EXCEPT / UNION (the official parser nests `A UNION B UNION C` as
  A + (B UNION C), so this part is 0 or 1; ORDER BY / LIMIT after a set operation belong to its last
  query, not to the top level);
- others = [aggregates > 1] + [SELECT columns > 1] + [WHERE conditions > 1] + [GROUP BY columns > 1].
  "Aggregates", as the official `count_agg` counts them: aggregate SELECT items, GROUP BY items and
  ORDER BY operands, plus the negated (NOT IN / NOT LIKE ...) WHERE and HAVING conditions and the AND /
  OR connectors of HAVING (its `count_agg` reads the first field of each list entry, which is the NOT
  flag of a condition and a non-zero string for a connector); aggregates inside a condition are not.
- class rules exactly as `eval_hardness` (`classify`).

What is covered: FROM subqueries are one table unit and never nested SQL (as the official parser);
comma joins and JOIN ... ON count alike; `BETWEEN (SELECT ..) AND (SELECT ..)` counts two nested.
What is not: the official parser fails on some SQL (e.g. `IS NOT NULL`, arithmetic on aggregates in
SELECT, parenthesised conditions); this port classifies them (`x IS NOT NULL` is one condition, not
negated; a SELECT item counts as aggregated only when it is an aggregate at its top). SQL that sqlglot
cannot parse has no hardness (`hardness` returns None, counted as "unparsed").
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["HARDNESS", "Components", "accuracy_by_hardness", "classify", "components", "hardness"]

HARDNESS = ("easy", "medium", "hard", "extra")
UNPARSED = "unparsed"


@dataclass(frozen=True)
class Components:
    component1: int
    component2: int
    others: int


def classify(c1: int, c2: int, others: int) -> str:
    """The class of the counts, as `Evaluator.eval_hardness`."""
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if (
        (others > 2 and c1 <= 2 and c2 == 0)
        or (2 < c1 <= 3 and others <= 2 and c2 == 0)
        or (c1 <= 1 and others == 0 and c2 <= 1)
    ):
        return "hard"
    return "extra"


def _exp():
    from sqlglot import exp

    return exp


def _unwrap(node):
    exp = _exp()
    while isinstance(node, exp.Paren | exp.Alias):
        node = node.this
    return node


def _flatten(node) -> tuple[list, list[str]]:
    """(the conditions, the connectors 'and'/'or') of a boolean expression, left to right."""
    exp = _exp()
    node = _unwrap(node)
    if isinstance(node, exp.And | exp.Or):
        left, lc = _flatten(node.this)
        right, rc = _flatten(node.expression)
        return left + right, lc + ["and" if isinstance(node, exp.And) else "or"] + rc
    return [node], []


def _is_query(node) -> bool:
    exp = _exp()
    return isinstance(node, exp.Subquery | exp.Select | exp.SetOperation)


def _condition(node) -> tuple[bool, bool, int]:
    """(negated, LIKE, nested queries among its operands) of one condition."""
    exp = _exp()
    negated = False
    if isinstance(node, exp.Not):
        node = _unwrap(node.this)
        negated = not isinstance(node, exp.Is)  # `x IS NOT NULL` is one IS condition
    negated = negated or bool(node.args.get("negate"))  # sqlglot's `x NOT LIKE y`
    nested = 0
    for value in node.args.values():
        for v in value if isinstance(value, list) else [value]:
            nested += _is_query(v)
    return negated, isinstance(node, exp.Like | exp.ILike), nested


def _is_agg(node) -> bool:
    exp = _exp()
    return isinstance(_unwrap(node), exp.Count | exp.Sum | exp.Avg | exp.Min | exp.Max)


def _order_aggs(node) -> int:
    """Aggregates of one ORDER BY key: the official val_unit holds up to two operands."""
    exp = _exp()
    node = _unwrap(node.this if isinstance(node, exp.Ordered) else node)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
        return _is_agg(node.this) + _is_agg(node.expression)
    return int(_is_agg(node))


def _top_select(tree):
    """(the top-level SELECT, 1 if a set operation follows it else 0)."""
    exp = _exp()
    setop = 0
    tree = _unwrap(tree)
    while isinstance(tree, exp.SetOperation | exp.Subquery):
        if isinstance(tree, exp.SetOperation):
            setop = 1
        tree = _unwrap(tree.this)
    if not isinstance(tree, exp.Select):
        raise ValueError(f"not a SELECT query: {type(tree).__name__}")
    return tree, setop


def components(sql: str) -> Components:
    """The three counts of `eval_hardness` for `sql`; ValueError when it does not parse as one SELECT."""
    import sqlglot

    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError as e:
        raise ValueError(f"sqlglot cannot parse the SQL: {e}") from None
    if tree is None:
        raise ValueError("empty SQL")
    sel, setop = _top_select(tree)
    frm, joins = sel.args.get("from_"), sel.args.get("joins") or []
    units = (1 if frm is not None else 0) + len(joins)
    on_conds, on_conn = [], []
    for j in joins:
        if j.args.get("on") is not None:
            c, k = _flatten(j.args["on"])
            on_conds += c
            on_conn += k
    where = sel.args.get("where")
    w_conds, w_conn = _flatten(where.this) if where is not None else ([], [])
    having = sel.args.get("having")
    h_conds, h_conn = _flatten(having.this) if having is not None else ([], [])
    group = sel.args.get("group")
    group_items = group.expressions if group is not None else []
    order = sel.args.get("order")
    order_items = order.expressions if order is not None else []
    w_info = [_condition(c) for c in w_conds]
    h_info = [_condition(c) for c in h_conds]
    all_info = [_condition(c) for c in on_conds] + w_info + h_info
    c1 = sum(x is not None for x in (where, group, order, sel.args.get("limit")))
    c1 += max(units - 1, 0)
    c1 += (on_conn + w_conn + h_conn).count("or") + sum(like for _, like, _ in all_info)
    c2 = sum(n for _, _, n in all_info) + setop
    aggs = sum(map(_is_agg, sel.expressions)) + sum(neg for neg, _, _ in w_info)
    aggs += sum(map(_is_agg, group_items)) + sum(map(_order_aggs, order_items))
    aggs += sum(neg for neg, _, _ in h_info) + len(h_conn)
    others = (aggs > 1) + (len(sel.expressions) > 1) + (len(w_conds) > 1) + (len(group_items) > 1)
    return Components(c1, c2, others)


@functools.lru_cache(maxsize=65536)
def hardness(sql: str) -> str | None:
    """'easy' / 'medium' / 'hard' / 'extra' of a gold SQL; None when it does not parse."""
    try:
        c = components(sql)
    except (ValueError, RecursionError):
        return None
    return classify(c.component1, c.component2, c.others)


def accuracy_by_hardness(results: Iterable[Mapping], gold_of: Mapping[str, str]) -> dict:
    """Per class of the gold (`HARDNESS`, then "unparsed" if any): {"n" scored, "correct", "accuracy",
    "excluded"} over result rows {"task_id", "correct" (None = excluded)}; rows whose task has no gold
    in `gold_of` are skipped."""
    out = {h: {"n": 0, "correct": 0, "accuracy": None, "excluded": 0} for h in HARDNESS}
    for r in results:
        gold = gold_of.get(str(r.get("task_id")))
        if gold is None:
            continue
        cls = hardness(gold) or UNPARSED
        d = out.setdefault(cls, {"n": 0, "correct": 0, "accuracy": None, "excluded": 0})
        if r.get("correct") is None:
            d["excluded"] += 1
        else:
            d["n"] += 1
            d["correct"] += int(bool(r["correct"]))
    for d in out.values():
        d["accuracy"] = d["correct"] / d["n"] if d["n"] else None
    return out
