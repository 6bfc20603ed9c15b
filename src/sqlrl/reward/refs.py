"""Keys and sizes of the gold payloads the Evaluator ships to sandbox workers.

What is covered: `ref_key` gives one object (with the SQL whose shape goes with it) the same
process-wide key while it is registered, and never gives that key to another object (`IdentityMemo`,
also the cut cache's); `cells` is the size (rows x columns, at least 1) that decides whether a payload
is shipped at all.
What is not: the payloads themselves (`sqlrl.reward.evaluator`, `sqlrl.reward.scoring`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["IdentityMemo", "cells", "ref_key"]


class IdentityMemo:
    """Values computed once per (objects, text) while those very objects are registered: the memo holds
    the objects, so their ids cannot be reused by other objects under the same key; when full, the older
    half of the entries is dropped. Thread-safe; `compute` runs outside the lock, and when two threads
    race on one key the first value stored is the one both get."""

    def __init__(self, max_entries: int):
        self._entries: dict[tuple, tuple[tuple, Any]] = {}
        self._max = max_entries
        self._lock = threading.Lock()

    def _hit(self, key: tuple, objs: tuple) -> tuple[bool, Any]:
        hit = self._entries.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], objs)):
            return True, hit[1]
        return False, None

    def get(self, objs: tuple, text: str, compute: Callable[[], Any]) -> Any:
        key = (*map(id, objs), text)
        with self._lock:
            found, value = self._hit(key, objs)
        if found:
            return value
        value = compute()
        with self._lock:
            found, first = self._hit(key, objs)
            if found:
                return first
            if len(self._entries) >= self._max:
                for old in list(self._entries)[: self._max // 2]:
                    del self._entries[old]
            self._entries[key] = (objs, value)
        return value


_KEYS = IdentityMemo(8192)  # (gold result, gold sql) -> its key
_ref_serial = iter(range(1, 2**62))


def ref_key(obj: Any, sql: str) -> int:
    """A process-wide key for a gold result object (and the SQL whose shape goes with it): the same
    object always gets the same key while it is registered, and no other object gets it."""
    return _KEYS.get((obj,), sql, lambda: next(_ref_serial))


def cells(res: Any) -> int:
    """1 + rows x columns of a result (the weight of shipping it)."""
    rows = getattr(res, "rows", None) or []
    return 1 + len(rows) * max(1, len(getattr(res, "columns", None) or []))
