"""Keys and sizes of the gold payloads the Evaluator ships to sandbox workers.

What is covered: `ref_key` gives one object (with the SQL whose shape goes with it) the same
process-wide key while it is registered, and never gives that key to another object; `cells` is the
size (rows x columns, at least 1) that decides whether a payload is shipped at all.
What is not: the payloads themselves (`sqlrl.reward.evaluator`, `sqlrl.reward.scoring`).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["cells", "ref_key"]

_REFS: dict[tuple[int, str], tuple[int, Any]] = {}  # (id(gold result), gold sql) -> (key, gold result)
_REFS_MAX = 8192
_REFS_LOCK = threading.Lock()
_ref_serial = iter(range(1, 2**62))


def ref_key(obj: Any, sql: str) -> int:
    """A process-wide key for a gold result object (and the SQL whose shape goes with it): the same
    object always gets the same key while it is registered, and the registry holds the object, so its
    id cannot be reused by another object under that key."""
    k = (id(obj), sql)
    with _REFS_LOCK:
        hit = _REFS.get(k)
        if hit is not None and hit[1] is obj:
            return hit[0]
        if len(_REFS) >= _REFS_MAX:
            for old in list(_REFS)[: _REFS_MAX // 2]:
                del _REFS[old]
        key = next(_ref_serial)
        _REFS[k] = (key, obj)
        return key


def cells(res: Any) -> int:
    """1 + rows x columns of a result (the weight of shipping it)."""
    rows = getattr(res, "rows", None) or []
    return 1 + len(rows) * max(1, len(getattr(res, "columns", None) or []))
