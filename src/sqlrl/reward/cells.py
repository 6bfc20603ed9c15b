"""Cell, row and multiset equality under the reward's tolerance rule, shared by the result comparison.

What is covered:
- `CellCmp`: two cells are equal when Python `==` says so, or, with tolerance on, when one is a
  non-integral float, both are numbers and `math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)`
  (1e-12 relative, 1e-9 absolute near zero: float rounding noise, not an answer rounded to a decimal
  for values under 5e10); integers and integral floats always
  compare exactly; rows cell by cell; multisets exactly, then (tolerance on, floats present) by
  groups of equal non-numeric cells, sorted, then by an exact bipartite matching for groups of at
  most 64 rows;
- `CellCmp.submultiset`: whether every row of one list pairs with its own equal row of another;
- `counts` / `project`: a multiset as a dict, and rows projected on columns.

What is not:
- a tolerance group over 64 rows that sorts differently may be declared unequal (a possible false
  negative, never a false positive); standard library only.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any

__all__ = ["ABS_TOL", "REL_TOL", "CellCmp", "counts", "is_num", "non_integral", "project"]

REL_TOL = 1e-12  # float rounding noise (summation order), not a rounded answer
ABS_TOL = 1e-9
_MATCHING_MAX = 64
_POOL_MAX = 4096

try:
    from _collections import _count_elements  # what Counter uses to count
except ImportError:  # pragma: no cover - other Pythons

    def _count_elements(mapping: dict, iterable: Any) -> None:
        get = mapping.get
        for v in iterable:
            mapping[v] = get(v, 0) + 1


def counts(values: Any) -> dict:
    """{value: count}: a Counter without its Python-level overhead (equal dicts <=> equal multisets)."""
    d: dict = {}
    _count_elements(d, values)
    return d


def is_num(v: Any) -> bool:
    return isinstance(v, int | float)


def non_integral(v: Any) -> bool:
    """A float with a fractional part (NaN and infinities included): the only cells compared with tolerance."""
    return type(v) is float and not v.is_integer()


class CellCmp:
    """Cell/row/multiset equality under one tolerance setting (tol=False: exact Python equality)."""

    def __init__(self, tol: bool, rel: float = REL_TOL, abs_: float = ABS_TOL):
        self.tol = tol
        self.rel = rel
        self.abs = abs_

    def cell(self, a: Any, b: Any) -> bool:
        if a == b:
            return True
        if not self.tol or not (non_integral(a) or non_integral(b)) or not (is_num(a) and is_num(b)):
            return False  # integers and integral floats compare exactly (rule 2)
        try:
            return math.isclose(float(a), float(b), rel_tol=self.rel, abs_tol=self.abs)
        except OverflowError:
            return False

    def row(self, a: tuple, b: tuple) -> bool:
        if a == b:
            return True
        if not self.tol:
            return False
        return len(a) == len(b) and all(self.cell(x, y) for x, y in zip(a, b))

    def multiset(self, a: list[tuple], b: list[tuple], has_float: bool, charge: Any = None) -> bool:
        """`charge(n)`, when given, is called with the row comparisons an exact matching will make
        before it is made (it may raise to stop the comparison)."""
        if len(a) != len(b):
            return False
        if a == b or counts(a) == counts(b):
            return True
        if not (self.tol and has_float):
            return False
        return self._tol_multiset(a, b, charge)

    def _tol_multiset(self, a: list[tuple], b: list[tuple], charge: Any = None) -> bool:
        def split(rows: list[tuple]) -> dict:
            groups: dict[tuple, list[tuple]] = {}
            for r in rows:
                key = tuple(_NUM if is_num(v) and not isinstance(v, bool) else v for v in r)
                groups.setdefault(key, []).append(r)
            return groups

        ga, gb = split(a), split(b)
        if ga.keys() != gb.keys():
            return False
        for key, ra in ga.items():
            rb = gb[key]
            if len(ra) != len(rb):
                return False
            numidx = [i for i, k in enumerate(key) if k is _NUM]

            def sk(r: tuple, numidx: list[int] = numidx) -> tuple:
                return tuple(float(r[i]) for i in numidx)

            sa, sb = sorted(ra, key=sk), sorted(rb, key=sk)
            if all(self.row(x, y) for x, y in zip(sa, sb)):
                continue
            if len(ra) > _MATCHING_MAX:
                return False
            if charge is not None:
                charge(len(ra) * len(rb))
            if not self._bipartite(sa, sb):
                return False
        return True

    def submultiset(
        self, a: list[tuple], pool: list[tuple], has_float: bool, have: dict | None = None, charge: Any = None
    ) -> bool:
        """Whether every row of `a` pairs with its own equal row of `pool` (duplicates count). With
        tolerance and floats, past the exact count an exact matching is tried when `a` has at most 64
        rows and `pool` at most 4096 (beyond: False, a possible false negative). `have`: `counts(pool)`
        when the caller has it; `charge` as in `multiset`."""
        if len(a) > len(pool):
            return False
        need = counts(a)
        if have is None:
            have = counts(pool)
        if all(have.get(r, 0) >= c for r, c in need.items()):
            return True
        if not (self.tol and has_float) or len(a) > _MATCHING_MAX or len(pool) > _POOL_MAX:
            return False
        if charge is not None:
            charge(len(a) * len(pool))
        return self._bipartite(a, pool)

    def _bipartite(self, a: list[tuple], b: list[tuple]) -> bool:
        adj = [[j for j, y in enumerate(b) if self.row(x, y)] for x in a]
        match_b: list[int] = [-1] * len(b)

        def augment(i: int, seen: list[bool]) -> bool:
            for j in adj[i]:
                if not seen[j]:
                    seen[j] = True
                    if match_b[j] < 0 or augment(match_b[j], seen):
                        match_b[j] = i
                        return True
            return False

        return all(augment(i, [False] * len(b)) for i in range(len(a)))


class _NumMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<num>"


_NUM = _NumMarker()


def project(rows: list[tuple], cols: tuple[int, ...] | list[int]) -> list[tuple]:
    if not cols:
        return [()] * len(rows)
    if len(cols) == 1:
        c = cols[0]
        return [(r[c],) for r in rows]
    return list(map(itemgetter(*cols), rows))
