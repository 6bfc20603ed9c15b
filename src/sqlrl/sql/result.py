"""`SQLResult`: the outcome of one statement run by the sandbox or the replica pool, and its encodings.

Covered: the statuses (`STATUSES`; `ok` is the only success, `worker_crash` is an infrastructure
failure, never a wrong answer), a JSON-safe dict form that round-trips (blobs as
{"$blob_hex": ...}; inf / nan as "Infinity" / "-Infinity" / "NaN"), and a deterministic text
rendering for the policy (no timings).
Not covered: float values that are NaN or infinite come back from `from_dict` as the strings above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# the result caps of one statement, the same for a gold (`sqlrl.tasks.goldcache`) and a prediction
# (`sqlrl.sql.sandbox.Sandbox`): a gold over them is unscorable, never a mismatch
MAX_ROWS = 100_000
MAX_RESULT_BYTES = 8 * 2**20  # marshalled column names and rows
MAX_VALUE_BYTES = 4 * 2**20  # the longest string or blob a statement may build (SQLITE_LIMIT_LENGTH)

STATUSES = (
    "ok",
    "empty_sql",
    "syntax_error",
    "forbidden",
    "multiple_statements",
    "timeout",
    "too_many_rows",
    "too_large",
    "runtime_error",
    "worker_crash",
)


def _json_value(v: Any) -> Any:
    if isinstance(v, bytes | bytearray | memoryview):
        return {"$blob_hex": bytes(v).hex()}
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def _from_json_value(v: Any) -> Any:
    if isinstance(v, dict) and "$blob_hex" in v:
        return bytes.fromhex(v["$blob_hex"])
    return v


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if isinstance(v, bytes):
        h = v[:32].hex()
        return f"x'{h}'" + ("..." if len(v) > 32 else "")
    if isinstance(v, float):
        return repr(v)
    return str(v)


@dataclass(frozen=True)
class SQLResult:
    status: str  # one of STATUSES
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)  # rows kept (up to the caps)
    row_count: int = 0  # == len(rows)
    elapsed_ms: float = 0.0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        """JSON-safe dict: blobs become {"$blob_hex": "..."}; inf/nan become "Infinity"/"-Infinity"/"NaN"."""
        return {
            "status": self.status,
            "columns": list(self.columns),
            "rows": [[_json_value(v) for v in r] for r in self.rows],
            "row_count": self.row_count,
            "elapsed_ms": round(self.elapsed_ms, 3) if math.isfinite(self.elapsed_ms) else 0.0,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict) -> SQLResult:
        return cls(
            status=d["status"],
            columns=list(d.get("columns", [])),
            rows=[tuple(_from_json_value(v) for v in r) for r in d.get("rows", [])],
            row_count=int(d.get("row_count", 0)),
            elapsed_ms=float(d.get("elapsed_ms", 0.0)),
            message=str(d.get("message", "")),
        )

    def render(self, max_rows: int = 10, max_chars: int = 2000) -> str:
        """Deterministic text for the policy (no timings): status line, header, capped rows, message."""
        n = self.row_count
        plural = "row" if n == 1 else "rows"
        if self.status == "ok":
            lines = [f"status: ok ({n} {plural})"]
        elif self.status in ("too_many_rows", "too_large"):
            lines = [f"status: {self.status} (result cut after {n} {plural})"]
        else:
            lines = [f"status: {self.status}"]
        if self.columns:
            lines.append(" | ".join(_cell(c) for c in self.columns))
            shown = self.rows[: max(0, max_rows)]
            lines.extend(" | ".join(_cell(v) for v in r) for r in shown)
            if n > len(shown):
                lines.append(f"... {n - len(shown)} more rows")
        if self.message:
            lines.append(("error: " if self.status != "ok" else "note: ") + self.message)
        text = "\n".join(lines)
        if len(text) > max_chars:
            tail = "\n... (output truncated)"
            text = text[: max(0, max_chars - len(tail))] + tail
        return text


def failure(status: str, message: str = "", elapsed_ms: float = 0.0) -> SQLResult:
    """A result without columns or rows (pre-check answers, watchdog kills, crashes)."""
    return SQLResult(status, [], [], 0, elapsed_ms, message)
