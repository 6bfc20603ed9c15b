"""Digest of a `scripts/cli_compare.sh OUTDIR` run, for diffing before/after a refactor.

usage: python scripts/cli_compare_normalize.py OUTDIR [--sub PATH=TOKEN ...] > OUTDIR/digest.txt

Standard library only; reads no sqlrl module. Per command folder (OUTDIR/NN-name/): exit code,
stdout, stderr (progress bars dropped), then every text file the command wrote (JSON/JSONL
re-serialised with sorted keys, Markdown/TOML/text as is), all normalised: wall-clock times,
dates, durations, PIDs, git commits, host/platform/library versions and the absolute paths given
with --sub are removed or replaced by tokens. Kept: SQL, rewards, statuses, accuracies, exit codes,
weight/data hashes, verdicts, report text. Long token-id lists / huge strings / huge dicts are
replaced by a sha256 of their normalised form so the digest stays readable but still sensitive.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

SKIP_FILES = {"wall_s", "cmd"}  # per-command bookkeeping written by cli_compare.sh (timing, argv)
TEXT_SUFFIXES = {".md", ".txt", ".toml", ".csv", ".jinja", ".log"}
SKIP_DIRS = {".goldcache", "tb", "tensorboard", "__pycache__"}

# JSON keys whose values are wall-clock / environment dependent
_DROP_KEY = re.compile(
    r"""^(
        started|finished|created|created_at|updated|date|datetime|timestamp|ts|time|when|
        git|commit|git_commit|code_version|sqlrl_version|version|
        hostname|host|platform|python|torch|transformers|cuda|pid|ppid|
        maxrss.*|peak_.*mem.*|.*rss.*|.*_mb|.*_gb|.*_bytes_per_s|
        timings|.*_per_s|.*per_sec.*|throughput.*|
        (.*_)?(s|ms|sec|secs|seconds|minutes|mins|hours)|
        time_.*|.*_time|wall.*|elapsed.*|duration.*|gpu_minutes.*|device_minutes.*
    )$""",
    re.X,
)
_KEEP_KEY = re.compile(r"timeout|budget|max_|_limit|limit_", re.I)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TQDM = re.compile(
    r"(\d+%\|)|(\|\s*\d+/\d+ \[)|(\[\d+:\d+(:\d+)?<)|(\d(it|step|sql|traj|B)/s\])|(s/(it|step|traj)\])"
)
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2}|\s?UTC)?")
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}:\d{2}(\.\d+)?\b")
_DUR = re.compile(
    r"(?<![\w.])[~≈]?\d+(\.\d+)?(e[+-]?\d+)?\s?(ms|s|sec|secs|seconds|min|mins|minutes|h|hours|GPU-minutes|GPU minutes)\b"
)
_TILDE_NUM = re.compile(r"~\d+(\.\d+)?")  # report.md "GPU minutes" estimated from wall time on CPU
_RATE = re.compile(r"\d+(\.\d+)?\s?(it|tok|tokens|sql|traj|step|steps|B|kB|MB)/s\b")
_PID = re.compile(r"\b(pid|PID)([ =:]+)\d+")
_GIT40 = re.compile(r"(?<![0-9a-f:])[0-9a-f]{40}(?![0-9a-f])")
_GITSHORT = re.compile(r"\b(code|commit|at|git)\s+[0-9a-f]{7,12}\b")
_TMP = re.compile(r"/tmp/[A-Za-z0-9_.\-]+")
_KV_TIME = re.compile(r"\b(elapsed\w*|time\w*|wall\w*|\w+_(?:s|ms|sec|seconds))(\s*[:=]?\s*)\d+(\.\d+)?\b")
_MEM = re.compile(r"\b\d+(\.\d+)?\s?(KB|MB|GB|KiB|MiB|GiB)\b")

SUBS: list[tuple[str, str]] = []


def norm_text(s: str) -> str:
    for path, token in SUBS:
        s = s.replace(path, token)
    s = _KV_TIME.sub(r"\1\2<T>", s)
    s = _ISO.sub("<DATETIME>", s)
    s = _CLOCK.sub("<CLOCK>", s)
    s = _RATE.sub("<RATE>", s)
    s = _DUR.sub("<T>", s)
    s = _TILDE_NUM.sub("~<T>", s)
    s = _PID.sub(r"\1\2<PID>", s)
    s = _GIT40.sub("<GIT>", s)
    s = _GITSHORT.sub(r"\1 <GIT>", s)
    s = _TMP.sub("<TMP>", s)
    s = _MEM.sub("<MEM>", s)
    return s


def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def norm_json(o, key: str | None = None):
    if isinstance(o, dict):
        out = {}
        for k, v in o.items():
            if _DROP_KEY.match(str(k)) and not _KEEP_KEY.search(str(k)):
                continue
            if str(k) == "machine" and isinstance(v, dict):
                v = {kk: vv for kk, vv in v.items() if kk in ("cpu_count", "accelerator")}
            out[norm_text(str(k))] = norm_json(v, str(k))
        if len(out) > 120:
            return f"<dict n={len(out)} sha={_h(out)}>"
        return out
    if isinstance(o, list):
        items = [norm_json(v, key) for v in o]
        if len(items) > 64 and all(not isinstance(v, (dict, list)) for v in items):
            return f"<list n={len(items)} sha={_h(items)}>"
        return items
    if isinstance(o, str):
        s = norm_text(o)
        if len(s) > 4000:
            return f"<str n={len(s)} sha={_h(s)}>"
        return s
    if isinstance(o, float):
        return float(f"{o:.10g}")
    return o


def dump_json(o) -> str:
    return json.dumps(norm_json(o), sort_keys=True, ensure_ascii=False)


def stream_lines(raw: str) -> list[str]:
    out = []
    for line in _ANSI.sub("", raw).split("\n"):
        segs = [seg for seg in line.split("\r") if seg.strip() and not _TQDM.search(seg)]
        if segs:
            out.append(norm_text(segs[-1].rstrip()))
    return out


def stream_block(raw: str) -> list[str]:
    """stdout/stderr: a JSON document, or lines of which those that are JSON objects get normalised."""
    try:
        doc = json.loads(raw)
        if isinstance(doc, (dict, list)):
            return [json.dumps(norm_json(doc), sort_keys=True, indent=1, ensure_ascii=False)]
    except json.JSONDecodeError:
        pass
    out = []
    for line in stream_lines(raw):
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(dump_json(json.loads(line)))
                continue
            except json.JSONDecodeError:
                pass
        out.append(line)
    return out


def file_block(path: Path, rel: str) -> list[str]:
    lines = [f"--- file {rel}"]
    try:
        raw = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return lines + [f"<binary {path.stat().st_size} bytes>"]
    if path.suffix == ".json":
        try:
            return lines + [
                json.dumps(norm_json(json.loads(raw)), sort_keys=True, indent=1, ensure_ascii=False)
            ]
        except json.JSONDecodeError:
            pass
    if path.suffix == ".jsonl":
        for ln in raw.splitlines():
            if ln.strip():
                try:
                    lines.append(dump_json(json.loads(ln)))
                except json.JSONDecodeError:
                    lines.append(norm_text(ln))
        return lines
    return lines + [norm_text(ln.rstrip()) for ln in raw.splitlines()]


def main(argv: list[str]) -> int:
    out = Path(argv[0]).resolve()
    for a in argv[1:]:
        if a.startswith("--sub="):
            a = a[len("--sub=") :]
        if "=" in a:
            p, t = a.split("=", 1)
            if p:
                SUBS.append((p.rstrip("/"), t))
    SUBS.append((str(out), "<OUT>"))
    SUBS.sort(key=lambda pt: -len(pt[0]))  # longest path first
    res: list[str] = []
    for cmd_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        res.append(f"===== {cmd_dir.name}")
        cmd = cmd_dir / "cmd"
        if cmd.exists():
            res.append("cmd: " + norm_text(cmd.read_text().strip()))
        rc = cmd_dir / "rc"
        res.append("rc: " + (rc.read_text().strip() if rc.exists() else "<missing>"))
        for stream in ("stdout", "stderr"):
            p = cmd_dir / stream
            if p.exists():
                res.append(f"--- {stream}")
                res += stream_block(p.read_text(encoding="utf-8", errors="replace"))
        top = {"stdout", "stderr", "rc", *SKIP_FILES}
        files = sorted(
            f for f in cmd_dir.rglob("*") if f.is_file() and not (f.parent == cmd_dir and f.name in top)
        )
        for f in files:
            rel = f.relative_to(cmd_dir)
            if any(part in SKIP_DIRS for part in rel.parts):
                continue
            if f.suffix in (".json", ".jsonl") or f.suffix in TEXT_SUFFIXES:
                res += file_block(f, str(rel))
            elif f.suffix == ".html":
                res.append(f"--- file {rel} (html, not compared)")
            else:
                res.append(f"--- file {rel} <{f.suffix or 'no suffix'} file, not compared>")
    sys.stdout.write("\n".join(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
