"""The lock of the veRL + vLLM + Ray wheel set for the GPU machine (scripts/verl-gpu.lock): make, read, check.

    python3 scripts/verl_lock.py make SPEC LOCK WHEELDIR [--uv UV]   # here: resolve, download, hash, write
    python3 scripts/verl_lock.py fetch LOCK WHEELDIR [--extra]       # here: download the lock's files
    python3 scripts/verl_lock.py check LOCK WHEELDIR [--extra]       # every file present, bytes + sha256
    python3 scripts/verl_lock.py files LOCK [--extra]                # the file names, in lock order
    python3 scripts/verl_lock.py version LOCK NAME                   # a locked version (carry/extra/device)
    python3 scripts/verl_lock.py device LOCK                         # there: the machine's versions
    python3 scripts/verl_lock.py pipcheck LOCK < pip-check-output    # there: unmet needs not overridden

Lock rows (whitespace-separated; `#` starts a comment): `carry NAME VERSION FILE BYTES SHA256` (travels),
`extra NAME VERSION FILE BYTES SHA256` (travels with --extra / VERL_GPU_EXTRA=1), `device NAME VERSION`
(expected from the machine; VERSION as resolved here), `override NAME SPEC` (a pin not honoured).
Stdlib only: it also runs on the GPU machine. Exit 1 when a check finds a problem, 2 for bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("carry", "extra", "device", "override")
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 38, 39)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def norm(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


class LockError(ValueError):
    """A malformed lock or spec line."""


def read_lock(path: Path) -> list[dict]:
    """The lock's rows as dicts (kind, name, version / spec, and file, bytes, sha256 for carry/extra)."""
    rows, seen = [], set()
    for i, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        f = line.split()
        kind = f[0]
        if kind not in KINDS:
            raise LockError(f"{path}:{i}: unknown row kind {kind!r}; use one of {', '.join(KINDS)}")
        want = {"carry": 6, "extra": 6, "device": 3, "override": 3}[kind]
        if len(f) != want:
            raise LockError(f"{path}:{i}: a {kind} row has {want} fields, this one {len(f)}: {line!r}")
        row = {"kind": kind, "name": norm(f[1])}
        if kind == "override":
            row["spec"] = f[2]
        else:
            row["version"] = f[2]
        if kind in ("carry", "extra"):
            file, size, sha = f[3], f[4], f[5]
            if not re.fullmatch(r"[0-9a-f]{64}", sha) or not size.isdigit():
                raise LockError(f"{path}:{i}: bytes must be an integer and sha256 64 hex digits: {line!r}")
            stem = norm(file.split("-")[0] if not file.endswith(".tar.gz") else file.rsplit("-", 1)[0])
            if stem != row["name"] or f"-{row['version']}" not in file.replace("_", "-"):
                raise LockError(f"{path}:{i}: file {file} is not {row['name']} {row['version']}")
            row.update(file=file, bytes=int(size), sha256=sha)
        key = (kind == "override", row["name"])
        if key in seen:
            raise LockError(f"{path}:{i}: {row['name']} appears twice")
        seen.add(key)
        rows.append(row)
    return rows


def travelling(rows: list[dict], extra: bool) -> list[dict]:
    """The rows whose files travel: carry, plus extra when asked."""
    return [r for r in rows if r["kind"] == "carry" or (extra and r["kind"] == "extra")]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_files(rows: list[dict], wheeldir: Path) -> list[str]:
    """Problems with the files of `rows` in `wheeldir` (missing, wrong size, wrong sha256)."""
    problems = []
    for r in rows:
        p = Path(wheeldir) / r["file"]
        if not p.is_file():
            problems.append(f"{r['file']}: missing")
        elif p.stat().st_size != r["bytes"]:
            problems.append(f"{r['file']}: {p.stat().st_size} bytes, the lock says {r['bytes']}")
        elif sha256_file(p) != r["sha256"]:
            problems.append(f"{r['file']}: sha256 differs from the lock")
    return problems


def pip_download(spec: str, dest: Path, sdist: bool = False) -> None:
    """`pip download --no-deps` of one requirement for CPython 3.12 on x86_64 Linux into `dest`."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest)]
    if sdist:
        cmd += ["--no-binary=:all:"]
    else:
        cmd += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
        for p in PLATFORMS:
            cmd += ["--platform", p]
    subprocess.run(cmd + [spec], check=True, stdout=subprocess.DEVNULL)


def fetch(rows: list[dict], wheeldir: Path) -> list[str]:
    """Download the files of `rows` that `wheeldir` lacks (or holds with another sha256); the problems left."""
    Path(wheeldir).mkdir(parents=True, exist_ok=True)
    for r in rows:
        if not check_files([r], wheeldir):
            continue
        pip_download(f"{r['name']}=={r['version']}", wheeldir, sdist=r["file"].endswith(".tar.gz"))
    return check_files(rows, wheeldir)


def read_spec(path: Path) -> dict:
    """The inputs of `make` (see scripts/verl-gpu.in)."""
    spec = {"require": [], "device": {}, "seen": {}, "names": set(), "override": {}, "extra": {}}
    for i, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind == "require":
            spec["require"].append(rest.strip())
        elif kind in ("device", "device-seen"):
            name, _, ver = rest.strip().partition("==")
            spec["device" if kind == "device" else "seen"][norm(name)] = ver
        elif kind == "device-names":
            spec["names"].update(norm(n) for n in rest.split())
        elif kind == "override":
            req, _, reason = rest.strip().partition(" ")
            spec["override"][norm(re.split(r"[<>=!~]", req)[0])] = (req, reason)
        elif kind == "extra":
            name, _, reason = rest.strip().partition(" ")
            spec["extra"][norm(name)] = reason
        else:
            raise LockError(f"{path}:{i}: unknown spec line {line!r}")
    spec["names"].update(spec["device"], spec["seen"])
    return spec


def resolve(spec: dict, uv: str) -> list[tuple[str, str]]:
    """(name, version) of the whole set for CPython 3.12 on manylinux_2_28 x86_64, by `uv pip compile`."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "req.in").write_text("\n".join(spec["require"]) + "\n")
        (t / "dev.txt").write_text("".join(f"{n}=={v}\n" for n, v in spec["device"].items()))
        (t / "ovr.txt").write_text("".join(req + "\n" for req, _ in spec["override"].values()))
        cmd = [
            uv,
            "pip",
            "compile",
            str(t / "req.in"),
            "-c",
            str(t / "dev.txt"),
            "--override",
            str(t / "ovr.txt"),
        ]
        cmd += ["--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28", "--no-annotate"]
        cmd += ["--no-header", "-o", str(t / "out.txt"), "-q"]
        subprocess.run(cmd, check=True)
        out = (t / "out.txt").read_text()
    return [(norm(n), v) for n, v in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", out, flags=re.M)]


def make(spec_path: Path, lock_path: Path, wheeldir: Path, uv: str) -> None:
    """Resolve the spec, download what travels into `wheeldir`, and write the lock."""
    spec = read_spec(spec_path)
    pairs = resolve(spec, uv)
    Path(wheeldir).mkdir(parents=True, exist_ok=True)
    lines = [
        "# veRL + vLLM + Ray for the GPU machine (CPython 3.12, x86_64, torch 2.11.0+cu130, numpy 2.5.2).",
        f"# Made by: python3 scripts/verl_lock.py make {spec_path} {lock_path} WHEELDIR (inputs and reasons:",
        f"# {spec_path}). Rows: carry|extra NAME VERSION FILE BYTES SHA256 (the files that travel; extra only",
        "# with VERL_GPU_EXTRA=1), device NAME VERSION (from the machine; VERSION as resolved here),",
        "# override NAME SPEC (a pin of the set not honoured). Used by scripts/verl-env.sh.",
    ]
    body = []
    for name, ver in pairs:
        known = spec["device"].get(name, spec["seen"].get(name))
        if name in spec["names"] and (known is None or known == ver):
            body.append(f"device {name} {ver}")
            continue
        kind = "extra" if name in spec["extra"] else "carry"
        match = _files_of(wheeldir, name, ver)
        if not match:
            try:
                pip_download(f"{name}=={ver}", wheeldir)
            except subprocess.CalledProcessError:  # no wheel for the machine: the source archive
                pip_download(f"{name}=={ver}", wheeldir, sdist=True)
            match = _files_of(wheeldir, name, ver)
        if not match:
            raise LockError(f"no file of {name} {ver} was downloaded into {wheeldir}")
        f = Path(wheeldir) / sorted(match)[0]  # one file per project and version
        body.append(f"{kind} {name} {ver} {f.name} {f.stat().st_size} {sha256_file(f)}")
    body += [f"override {n} {req}" for n, (req, _) in spec["override"].items()]
    Path(lock_path).write_text("\n".join(lines + body) + "\n")


def _files_of(wheeldir: Path, name: str, ver: str) -> list[str]:
    """The names of the files of project `name` at version `ver` in `wheeldir`."""
    out = []
    for p in Path(wheeldir).iterdir():
        n = norm(p.name)
        if n.startswith(f"{name}-{norm(ver)}-") or n == f"{name}-{norm(ver)}-tar-gz":
            out.append(p.name)
    return out


def device_versions(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(missing, different) for the device rows, from this Python's installed distributions."""
    from importlib.metadata import PackageNotFoundError, version

    missing, different = [], []
    for r in rows:
        if r["kind"] != "device":
            continue
        try:
            got = version(r["name"])
        except PackageNotFoundError:
            missing.append(r["name"])
            continue
        if got != r["version"]:
            different.append(f"{r['name']} {got} (resolved here: {r['version']})")
    return missing, different


def unmet(rows: list[dict], pip_check: str) -> list[str]:
    """`pip check` lines that concern the set and are not an override of the lock."""
    mine = {r["name"] for r in rows if r["kind"] in ("carry", "extra", "device")}
    overridden = {r["name"] for r in rows if r["kind"] == "override"}
    out = []
    for line in pip_check.splitlines():
        m = re.match(r"(\S+) \S+ (?:has requirement|requires) (\S+?)[\s,<>=!~;]", line + " ")
        if not m:
            continue
        owner, need = norm(m.group(1)), norm(re.split(r"[<>=!~\[]", m.group(2))[0])
        if owner in mine and need not in overridden:
            out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["make", "fetch", "check", "files", "version", "device", "pipcheck"])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--extra", action="store_true", help="include the extra rows")
    ap.add_argument("--uv", default=shutil.which("uv") or "uv")
    a = ap.parse_args(argv)
    need = {"make": 3, "fetch": 2, "check": 2, "files": 1, "version": 2, "device": 1, "pipcheck": 1}[a.cmd]
    if len(a.paths) != need:
        print(
            f"verl_lock {a.cmd}: needs {need} path arguments, got {len(a.paths)} (see --help)",
            file=sys.stderr,
        )
        return 2
    try:
        if a.cmd == "make":
            make(Path(a.paths[0]), Path(a.paths[1]), Path(a.paths[2]), a.uv)
            return 0
        rows = read_lock(Path(a.paths[0]))
    except (LockError, OSError) as e:
        print(f"verl_lock: {e}", file=sys.stderr)
        return 2
    if a.cmd == "files":
        print("\n".join(r["file"] for r in travelling(rows, a.extra)))
        return 0
    if a.cmd == "version":
        hit = [r["version"] for r in rows if r["name"] == norm(a.paths[1]) and "version" in r]
        if not hit:
            print(f"verl_lock: {a.paths[1]} is not in {a.paths[0]}", file=sys.stderr)
            return 2
        print(hit[0])
        return 0
    if a.cmd == "device":
        missing, different = device_versions(rows)
        for d in different:
            print(f"device version differs: {d}")
        for m in missing:
            print(f"missing on this machine: {m} (carry it: move its row to carry and re-make the lock)")
        return 1 if missing else 0
    if a.cmd == "pipcheck":
        bad = unmet(rows, sys.stdin.read())
        print("\n".join(bad))
        return 1 if bad else 0
    sel = travelling(rows, a.extra)
    problems = fetch(sel, Path(a.paths[1])) if a.cmd == "fetch" else check_files(sel, Path(a.paths[1]))
    for p in problems:
        print(p)
    total = sum(r["bytes"] for r in sel)
    print(f"{len(sel)} files, {total} bytes: {'ok' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
