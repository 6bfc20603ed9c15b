"""The schema text of a prompt: `agent.schema_sample_values` and `agent.schema_order` applied.

`schema_for_prompt(task, max_chars, sample_values, order)`; with both options off it is today's
`truncate_schema(task.schema, max_chars)`, unchanged. Otherwise the statements are read from the
task's database file (`sqlrl.tasks.schemainfo`, cached per database), with example values after each
table's CREATE when `sample_values > 0`, and:
- `order = "file"`: `truncate_schema` of that text (whole statements in file order while they fit);
- `order = "question"`: when the whole text fits in `max_chars` it is shown as is (file order, so a
  database that fits reads as with `file`). Otherwise tables are ranked by `rank_units` and kept whole
  in that order while the kept text plus the marker line fits (at the first that does not fit, it and
  every later one are left out; no skipping ahead), then shown in file order, a table with its indexes
  and triggers, followed by `-- [schema truncated: K of N tables left out]` (views count as tables).
  If even the first-ranked table does not fit, it alone is cut at the budget before the marker.

Ranking rule (`rank_units`), deterministic: words are maximal runs of letters and digits, lower-cased,
names also split at camelCase boundaries, and singularised (`-ies` -> `-y`, a final `s` dropped unless
`ss`, for words longer than 3). Q = the question's words minus `STOPWORDS`. For each table:
`name_hits` = |Q & words of its name|; `column_hits` = |Q & (words of its column names, and of its
example values when shown) minus words found among the column/value words of more than half of the
database's tables| (so `id` or `name` rarely count). Tier 0: tables with a hit; tier 1: tables linked by
a foreign key (either direction) to a tier-0 table; tier 2: the rest. Order by (tier, -name_hits,
-column_hits, file position). A question that matches nothing keeps file order.
"""

from __future__ import annotations

import re

from sqlrl.tasks.schemainfo import SchemaInfo, SchemaUnit, schema_info

__all__ = [
    "STOPWORDS",
    "question_ordered_schema",
    "rank_units",
    "schema_for_prompt",
    "truncate_schema",
    "words",
]

STOPWORDS = frozenset(
    "a an the of in on at for to from by with and or not no is are was were be been being do does did "
    "has have had what which who whom whose where when how many much all each every any that this these "
    "those their its it there than as also list show give find return display please".split()
)

_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _singular(w: str) -> str:
    if len(w) > 3 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    return w


def words(text: str, *, split_camel: bool = False) -> set[str]:
    """The normalised words of `text` (see the module's ranking rule)."""
    if split_camel:
        text = _CAMEL.sub(" ", text)
    return {_singular(w.lower()) for w in _WORD.findall(text)}


def rank_units(
    question: str, units: tuple[SchemaUnit, ...] | list[SchemaUnit], with_values: bool
) -> list[SchemaUnit]:
    """`units` in the order the module docstring defines for `question`."""
    q = words(question) - STOPWORDS
    name_words = [words(u.name, split_camel=True) for u in units]
    col_words = []
    for u in units:
        ws: set[str] = set()
        for c in u.columns:
            ws |= words(c, split_camel=True)
        if with_values:
            for v in u.values:
                ws |= words(v)
        col_words.append(ws)
    seen: dict[str, int] = {}
    for ws in col_words:
        for w in ws:
            seen[w] = seen.get(w, 0) + 1
    common = {w for w, k in seen.items() if k > len(units) / 2}
    hits = [(len(q & nw), len(q & (cw - common))) for nw, cw in zip(name_words, col_words)]
    matched = {u.name for u, h in zip(units, hits) if sum(h)}
    partners = {p for u in units if u.name in matched for p in u.partners}

    def key(i: int) -> tuple:
        u = units[i]
        tier = 0 if u.name in matched else 1 if u.name in partners else 2
        return (tier, -hits[i][0], -hits[i][1], u.index)

    return [units[i] for i in sorted(range(len(units)), key=key)]


def truncate_schema(schema: str, max_chars: int) -> str:
    """Keep whole CREATE statements in order while they fit in `max_chars`, then say how many were cut.

    Statements are separated by lines that start with `CREATE ` (case-insensitive). If even the first
    statement does not fit, it is cut at `max_chars` characters. The truncation line itself is not
    counted against the budget.
    """
    if len(schema) <= max_chars:
        return schema
    parts = re.split(r"(?im)^(?=create\s)", schema)
    parts = [p for p in parts if p.strip()]
    kept: list[str] = []
    used = 0
    for p in parts:
        if used + len(p) > max_chars:
            break
        kept.append(p)
        used += len(p)
    if not kept:
        return (
            schema[:max_chars] + f"\n-- [schema truncated: {len(parts)} statements cut at {max_chars} chars]"
        )
    return "".join(kept).rstrip() + f"\n-- [schema truncated: {len(parts) - len(kept)} more statements]"


def _marker(left: int, n: int) -> str:
    return f"-- [schema truncated: {left} of {n} tables left out]"


def question_ordered_schema(question: str, info: SchemaInfo, max_chars: int, with_values: bool) -> str:
    """The schema text for `order = "question"` (module docstring)."""
    full = info.file_order_text
    if len(full) <= max_chars:
        return full
    order = rank_units(question, info.units, with_values)
    n = len(order)
    kept: list[SchemaUnit] = []
    used = 0
    for u in order:
        sep = 2 if kept else 0
        if used + sep + len(u.text) + 1 + len(_marker(n - len(kept) - 1, n)) > max_chars:
            break
        kept.append(u)
        used += sep + len(u.text)
    if not kept:
        marker = _marker(n - 1, n)
        return order[0].text[: max(0, max_chars - len(marker) - 1)] + "\n" + marker
    shown = sorted(kept, key=lambda u: u.index)
    return "\n\n".join(u.text for u in shown) + "\n" + _marker(n - len(kept), n)


def schema_for_prompt(task, max_chars: int, sample_values: int = 0, order: str = "file") -> str:
    """The schema text a prompt shows for a public task (module docstring)."""
    if order not in ("file", "question"):
        raise ValueError(f"schema order {order!r} is not known; use 'file' or 'question'")
    schema = task.schema.strip()
    # a damaged database's tasks carry an empty schema and are excluded before any rollout
    if (not sample_values and order == "file") or not schema:
        return truncate_schema(schema, max_chars)
    info = schema_info(task.db_path, sample_values)
    if order == "file":
        return truncate_schema(info.file_order_text, max_chars)
    return question_ordered_schema(task.question, info, max_chars, with_values=sample_values > 0)
