"""What SQL may reach a worker, and what a worker's connection may do (sandbox and replica pool).

Covered:
- `check_statement`, run before a worker is involved (tokenizer aware: string literals, quoted
  identifiers and comments are understood): empty SQL -> `empty_sql`; more than one statement ->
  `multiple_statements` (trailing semicolons and comments are fine); a statement starting with a
  writing or administrative keyword -> `forbidden` (the sandbox's `SANDBOX_FORBIDDEN_START`, the
  replica pool's shorter `POOL_FORBIDDEN_START`); `EXPLAIN` only in front of SELECT / WITH / VALUES;
  SQL longer than `max_sql_chars` -> `too_large`. Only the one statement (original text up to its
  semicolon) is run.
- `read_only_authorizer` (sandbox): an allowlist of SELECT, READ, RECURSIVE, FUNCTION except
  `DENY_FUNCTIONS` (`load_extension`, `readfile`, `writefile`, `edit`, `fts3_tokenizer`, ...) and
  the read-only schema pragmas (`READ_ONLY_PRAGMAS`). Writes, DDL incl. TEMP objects, ATTACH,
  transactions, other pragmas and virtual tables (hence `json_each`, `json_tree`, `pragma_*()`) are
  denied; each denial is reported as `forbidden` (`sqlrl.sql.engine.classify_error`).
- `write_authorizer` (replicas): the same plus the write actions of `WRITE_ACTIONS`, reporting each
  one compiled; ATTACH / DETACH, transactions, savepoints, other pragmas, virtual tables, ANALYZE
  and VACUUM's internal ATTACH stay denied.
Not covered: the check is lexical; what a statement does is decided by SQLite under the authorizer.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from sqlrl.sql.result import SQLResult, failure

# strings / quoted identifiers (unterminated ones run to the end), comments, ';', plain runs
_LEX = re.compile(
    r"""'(?:[^']|'')*'?|"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?|--[^\n]*|/\*(?:.*?\*/|.*)|;|[^'"`\[;/-]+|[-/]""",
    re.S,
)
_WORD = re.compile(r"\s*([A-Za-z_]+)")
SANDBOX_FORBIDDEN_START = frozenset(
    "INSERT UPDATE DELETE REPLACE CREATE DROP ALTER ATTACH DETACH BEGIN COMMIT END ROLLBACK "
    "SAVEPOINT RELEASE VACUUM REINDEX ANALYZE".split()
)
_READ_START = frozenset(("SELECT", "WITH", "VALUES"))


def _scan(sql: str) -> list[tuple[int, int, str]]:
    """(start, end, text with comments blanked) of each non-empty statement of `sql`."""
    out: list[tuple[int, int, str]] = []
    cur: list[str] = []
    start = 0
    for m in _LEX.finditer(sql):
        tok = m.group()
        c = tok[0]
        if c == ";":
            s = "".join(cur).strip()
            if s:
                out.append((start, m.start(), s))
            cur = []
            start = m.end()
        elif (c == "-" and tok.startswith("--")) or (c == "/" and tok.startswith("/*")):
            cur.append(" ")
        else:
            cur.append(tok)
    s = "".join(cur).strip()
    if s:
        out.append((start, len(sql), s))
    return out


def split_statements(sql: str) -> list[str]:
    """Non-empty statements of `sql` (comments blanked out, string literals and identifiers intact)."""
    return [s for _, _, s in _scan(sql)]


def _precheck_fast_ok(sql: str) -> bool:
    """True when `_scan` is not needed (tests turn this off to compare)."""
    return ";" not in sql and "--" not in sql and "/*" not in sql


def check_statement(
    sql: str,
    max_sql_chars: int,
    forbidden_start: frozenset = SANDBOX_FORBIDDEN_START,
    context: str = "(read-only sandbox)",
) -> SQLResult | str:
    """A result for SQL that must not reach a worker, or the single statement to run (the original
    text up to its terminating semicolon: trailing semicolons and comments are dropped). The replica
    pool uses it with its own, shorter `forbidden_start` set (`POOLSANDBOX_FORBIDDEN_START`)."""
    if not isinstance(sql, str):
        return failure("runtime_error", f"SQL must be a string, not {type(sql).__name__}")
    if len(sql) > max_sql_chars:
        return failure("too_large", f"SQL text longer than {max_sql_chars} characters")
    if _precheck_fast_ok(sql):
        # the common case, same answer as `_scan`: without a semicolon there is at most one
        # statement, and without comment openers (even inside a quoted span) nothing is blanked, so
        # its text is the stripped SQL and it runs to the end of the text
        text = sql.strip()
        stmts = [(0, len(sql), text)] if text else []
    else:
        stmts = _scan(sql)
    if not stmts:
        return failure("empty_sql", "no SQL statement")
    if len(stmts) > 1:
        return failure("multiple_statements", f"exactly one statement is allowed, got {len(stmts)}")
    start, end, text = stmts[0]
    m = _WORD.match(text)
    if m:
        word = m.group(1).upper()
        if word == "EXPLAIN":
            rest = text[m.end() :]
            m2 = re.match(r"\s*QUERY\s+PLAN\b", rest, re.I)
            if m2:
                rest = rest[m2.end() :]
            m3 = _WORD.match(rest)
            if not m3 or m3.group(1).upper() not in _READ_START:
                return failure("forbidden", "EXPLAIN is allowed only for SELECT / WITH / VALUES")
        elif word in forbidden_start:
            return failure("forbidden", f"{word} statements are not allowed {context}")
    return sql[start:end]


def precheck(sql: str, max_sql_chars: int = 1_000_000) -> SQLResult | None:
    """A result for SQL that must not reach a worker, or None. Cheap; runs in the caller's process."""
    r = check_statement(sql, max_sql_chars)
    return r if isinstance(r, SQLResult) else None


POOL_FORBIDDEN_START = frozenset(
    "ATTACH DETACH VACUUM BEGIN COMMIT END ROLLBACK SAVEPOINT RELEASE ANALYZE".split()
)

DENY_FUNCTIONS = frozenset(
    (
        "load_extension",
        "readfile",
        "writefile",
        "edit",
        "fts3_tokenizer",
        "fts5",
        "fts5_source_id",
        "sqlar_compress",
        "sqlar_uncompress",
        "zipfile",
        "zipfile_cds",
        "eval",
        "sqlite_dbpage",
        "sqlite_dbdata",
        "sqlite_dbptr",
        "shell_add_schema",
        "shell_escape_crnl",
        "shell_int32",
        "shell_idquote",
        "shell_module_schema",
        "shell_putsnl",
        "lsmode",
        "lsdir",
        "fsdir",
        "sha3_query",
        "sqlite_rename_column",
        "sqlite_rename_table",
        "sqlite_rename_test",
        "sqlite_drop_column",
        "sqlite_rename_quotefix",
    )
)
READ_ONLY_PRAGMAS = frozenset(
    ("table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list")
)
_OK = sqlite3.SQLITE_OK
_DENY = sqlite3.SQLITE_DENY
_A_SELECT = sqlite3.SQLITE_SELECT
_A_READ = sqlite3.SQLITE_READ
_A_FUNCTION = sqlite3.SQLITE_FUNCTION
_A_RECURSIVE = sqlite3.SQLITE_RECURSIVE
_A_PRAGMA = sqlite3.SQLITE_PRAGMA


def read_only_authorizer(action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
    """SQLite authorizer of the sandbox: reads, recursive CTEs, functions off the deny list and
    the read-only schema pragmas; everything else is denied."""
    if action == _A_READ or action == _A_SELECT or action == _A_RECURSIVE:
        return _OK
    if action == _A_FUNCTION:
        return _DENY if (arg2 or "").lower() in DENY_FUNCTIONS else _OK
    if action == _A_PRAGMA:
        return _OK if (arg1 or "").lower() in READ_ONLY_PRAGMAS else _DENY
    return _DENY


POOL_DENY_FUNCTIONS = frozenset(
    f
    for f in DENY_FUNCTIONS
    if not f.startswith(("sqlite_rename_", "sqlite_drop_column"))  # internal-only, used by ALTER TABLE
)
_READ_ACTIONS = frozenset((sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE))
WRITE_ACTIONS = frozenset(
    getattr(sqlite3, n)
    for n in (
        "SQLITE_INSERT",
        "SQLITE_UPDATE",
        "SQLITE_DELETE",
        "SQLITE_CREATE_INDEX",
        "SQLITE_CREATE_TABLE",
        "SQLITE_CREATE_TEMP_INDEX",
        "SQLITE_CREATE_TEMP_TABLE",
        "SQLITE_CREATE_TEMP_TRIGGER",
        "SQLITE_CREATE_TEMP_VIEW",
        "SQLITE_CREATE_TRIGGER",
        "SQLITE_CREATE_VIEW",
        "SQLITE_DROP_INDEX",
        "SQLITE_DROP_TABLE",
        "SQLITE_DROP_TEMP_INDEX",
        "SQLITE_DROP_TEMP_TABLE",
        "SQLITE_DROP_TEMP_TRIGGER",
        "SQLITE_DROP_TEMP_VIEW",
        "SQLITE_DROP_TRIGGER",
        "SQLITE_DROP_VIEW",
        "SQLITE_ALTER_TABLE",
        "SQLITE_REINDEX",  # CREATE INDEX authorizes it internally
    )
)


def write_authorizer(on_write=None):
    """The authorizer for policy SQL on a writable replica (also used by `sqlrl.tasks.debugging.apply_submission`
    for a submitted solution): reads, the write actions of `WRITE_ACTIONS` (calling `on_write()` when
    one is compiled), functions except `POOL_DENY_FUNCTIONS`, the read-only pragmas of
    `READ_ONLY_PRAGMAS`; everything else (ATTACH / DETACH, transactions and savepoints, other pragmas,
    virtual tables, ANALYZE, VACUUM's internal ATTACH) is denied."""

    def authorizer(action: int, arg1: Any, arg2: Any, dbname: Any, source: Any) -> int:
        if action in _READ_ACTIONS:
            return _OK
        if action == _A_FUNCTION:
            return _DENY if (arg2 or "").lower() in POOL_DENY_FUNCTIONS else _OK
        if action == _A_PRAGMA:
            return _OK if (arg1 or "").lower() in READ_ONLY_PRAGMAS else _DENY
        if action in WRITE_ACTIONS:
            if on_write is not None:
                on_write()
            return _OK
        return _DENY

    return authorizer
