"""Small, dependency-free helpers for run artifacts: hashing, atomic JSON, JSONL, provenance.

Guarantees: `write_json_atomic` never leaves a half-written file under the final name (write to a
temporary file in the same folder, fsync, then `os.replace`). `sha256_file` streams, so large files
do not need to fit in memory. `lock_run_folder` gives one process at a time a run folder (an OS
lock on `RUN_LOCK_FILE` inside it, released by the OS when the holder dies, even by `kill -9`).
`run_kind` tells a folder's kind of run by its files; `check_out_folder` refuses another kind.
Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import platform
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def dumps(obj: Any, indent: int | None = 2) -> str:
    return json.dumps(obj, indent=indent, sort_keys=False, default=_json_default, ensure_ascii=False)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_bytes_atomic(path, (dumps(obj) + "\n").encode("utf-8"))


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def append_jsonl(path: str | os.PathLike, record: Any) -> None:
    append_jsonl_many(path, (record,))


def append_jsonl_many(path: str | os.PathLike, records: Iterable[Any]) -> None:
    """Append one JSON line per record, in one write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(dumps(r, indent=None) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(data)
        f.flush()


def write_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> None:
    data = "".join(dumps(r, indent=None) + "\n" for r in records)
    write_bytes_atomic(path, data.encode("utf-8"))


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Yield records; a truncated last line (a killed writer) is skipped, any other bad line raises.
    A path ending in `.gz` is read through gzip."""
    if str(path).endswith(".gz"):
        import gzip

        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.readlines()
    else:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not line.endswith("\n"):
                return
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None


def json_number(x: Any) -> float | None:
    """A number read from a JSON record as a float; None for anything else (a bool is not a number)."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def json_int(x: Any) -> int | None:
    """An integer read from a JSON record; None for anything else (a bool or a float is not one)."""
    return x if isinstance(x, int) and not isinstance(x, bool) else None


ARCHIVE_COMMIT_FILE = ".sqlrl_commit"  # at the root of a tree unpacked from a `git archive`


def _is_commit(sha: str) -> bool:
    return len(sha) == 40 and all(c in "0123456789abcdef" for c in sha)


def git_commit(cwd: str | os.PathLike | None = None) -> dict:
    """The commit of the sqlrl checkout (if any) and whether the tree was dirty. A tree unpacked from a
    `git archive` (no .git, e.g. on the GPU machine) has no checkout: then the commit comes from
    `ARCHIVE_COMMIT_FILE` at the tree's root, which `scripts/gpu.sh tree` writes from the archive's
    header (`archive_commit`), with "dirty": None (the unpacked files are not checked)."""
    cwd = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        if commit.returncode == 0:
            return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    for d in [cwd, *cwd.parents][:4]:  # src/sqlrl -> src -> the tree's root
        f = d / ARCHIVE_COMMIT_FILE
        if f.is_file():
            sha = f.read_text().strip()
            if _is_commit(sha):
                return {"commit": sha, "dirty": None, "source": "git archive"}
    return {"commit": None, "dirty": None}


def archive_commit(path: str | os.PathLike) -> str | None:
    """The commit id `git archive` writes into a tar's pax global header (what `git get-tar-commit-id`
    reads), or None; works for .tar and .tar.gz without git."""
    import tarfile

    try:
        with tarfile.open(path) as t:
            sha = t.pax_headers.get("comment", "")
    except (OSError, tarfile.TarError):
        return None
    return sha if _is_commit(sha) else None


def machine_info() -> dict:
    """Where a number was produced: host, CPU count, Python, and, if torch is already loaded and CUDA is
    available, the accelerator (the name of GPU 0) and `gpu_count` (the CUDA devices the process sees)."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "accelerator": None,
    }
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["accelerator"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["cuda"] = torch.version.cuda
    return info


RUN_LOCK_FILE = ".sqlrl.lock"  # inside a run folder while a process writes it; holds the writer's PID
_HELD: dict[str, int] = {}  # run folders this process holds -> how many times it entered each


class RunFolderLocked(RuntimeError):
    """Another process holds the run folder's lock (`lock_run_folder`)."""

    def __init__(self, folder: Path, pid: str):
        self.folder, self.pid = folder, pid
        super().__init__(
            f"run folder {folder} is in use by another sqlrl process (PID {pid}, lock {RUN_LOCK_FILE}); "
            "wait for it to end or stop it, or choose another folder"
        )


class RunFolderError(ValueError):
    """A run folder path that cannot be a folder (a file, a dangling link, an uncreatable path)."""


def check_out_path(folder: str | os.PathLike) -> None:
    """Refuse a run folder path that is a file or a symbolic link to nothing (RunFolderError, one line)."""
    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise RunFolderError(
            f"--out {folder} is a symbolic link to {os.readlink(folder)}, which does not exist; "
            "choose another --out folder, or create the link's target folder"
        )
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(
            f"--out {folder} is a file, not a folder; choose another --out folder (the file is left as it is)"
        )


def _holder_pid(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = os.pread(fd, 32, 0).decode("ascii").strip()
        if pid.isdigit():
            return pid
    return "unknown"


@contextlib.contextmanager
def lock_run_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive OS lock (`fcntl.flock`) on `folder` while the block runs; the folder is created
    when missing (a path that is a file, a dangling link or cannot be created: `RunFolderError`). Rules:
    - another process holding it: `RunFolderLocked` at once (no waiting), naming the folder and its PID;
    - this process holding it already (a runner calling another on the same folder): entered again;
      folders nested in a held one have their own locks, so a runner may run others inside its folder;
    - the lock file `RUN_LOCK_FILE` holds the PID; it is removed on release (and the folder too when
      this call created it and it is still empty); a holder killed by any signal leaves the file, unlocked
      (the OS drops the lock with the process), and the next writer takes it.
    POSIX only (fcntl). The lock file is not part of a run: folder checks and listings skip it."""
    import fcntl

    folder = Path(folder)
    check_out_path(folder)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a parent that is a file, no permission, a read-only file system
        raise RunFolderError(
            f"--out {folder}: cannot create the run folder ({e.strerror}: {e.filename}); choose another "
            "--out folder"
        ) from None
    key = os.path.realpath(folder)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield folder
        finally:
            _HELD[key] -= 1
        return
    path = folder / RUN_LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder_pid(fd)
            os.close(fd)
            raise RunFolderLocked(folder, pid) from None
        try:  # the file locked must still be the one at `path` (a holder removes it when it ends)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    _HELD[key] = 1
    try:
        yield folder
    finally:
        del _HELD[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()


def holds_run_lock(param: str) -> Callable:
    """Decorator: the function runs holding `lock_run_folder` on its argument named `param` (a run
    folder), from before its first check until it returns or raises."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            folder = sig.bind(*args, **kwargs).arguments[param]
            with lock_run_folder(folder):
                return fn(*args, **kwargs)

        return run

    return wrap


def run_kind(folder: str | Path) -> str | None:
    """What kind of sqlrl run `folder` holds, from the files it writes ("an experiment", "a training
    run", "an evaluation", "a leakage audit"); None for a missing or empty folder, or an interrupted
    evaluation's partial files."""
    folder = Path(folder)
    if (folder / "experiment.json").is_file():
        return "an experiment"
    if (folder / "config.json").is_file() or (folder / "steps.jsonl").is_file():
        return "a training run"
    if (folder / "run.json").is_file():
        try:
            is_eval = "task_ids" in json.loads((folder / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            is_eval = False
        return "an evaluation" if is_eval else "a training run"
    if (folder / "leakage.json").is_file():
        return "a leakage audit"
    return None


def check_out_folder(out: str | Path, command: str, writes: str) -> None:
    """Refuse an output folder holding another kind of run than `writes` (its files would be overwritten
    or mixed in): ValueError with one line naming what is there and the fix."""
    held = run_kind(out)
    if held is not None and held != writes:
        raise ValueError(
            f"--out {out} holds {held}; `sqlrl {command}` would overwrite or mix files into it; "
            "choose a new --out folder"
        )
