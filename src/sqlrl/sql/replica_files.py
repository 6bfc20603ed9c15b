"""Replica files of the replica pool: the WAL image of a template, and the three verified resets.

Covered:
- A WAL-mode replica is the template with header bytes 18-19 set to 2 (`wal_image`), which makes
  every connection to it use WAL mode, so a lease's statements land in `-wal` and the main file is
  written only by a checkpoint (which the worker's pin forbids, see `replica_worker`).
- `wal_discard`: delete `-wal` and `-shm` (0 bytes written, at most 136 + 32 header bytes read), only
  when the pin was held since the last reset, the main file's (size, mtime_ns, inode) is unchanged,
  there is no `-journal`, and the wal-index and WAL header record no checkpoint.
- `delta_reset`: one read pass over template and replica collects the `block`-byte blocks that differ
  and hashes the template; only when the hash equals the recorded sha256 are they written and the
  file truncated. More than `max_bytes` differing, or no replica file: None (copy instead).
- `full_copy`: the template copied to `<replica>.tmp`, then an atomic rename, only when the bytes
  read hash to the recorded sha256.
- Nothing is written from a template whose bytes changed since the pool started (`TemplateChanged`).
- `shm_in_use` (Linux, OFD locks): some connection still has the replica's wal-index mapped.
Not covered: a template changed and restored between two checks is not noticed (only the bytes
actually read are verified); a WAL discard reads no template bytes. `root_dir` must be on a local
filesystem (WAL needs shared memory and POSIX locks between processes).
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]


class TemplateChanged(RuntimeError):
    """A template's bytes no longer match the sha256 recorded when the pool started."""


def _check_template(rep: Any, src: str, got: str, want: str) -> None:
    """Nothing is written into a replica from a template whose bytes changed since the pool started."""
    if got != want:
        raise TemplateChanged(
            f"template of {rep.db_id!r} ({src}) changed since the pool started: sha256 "
            f"{got} != recorded {want}; refusing to reset replica {rep.index}"
        )


def remove_sidecars(path: str) -> None:
    """Delete the `-journal`, `-wal` and `-shm` files of a replica."""
    for s in ("-journal", "-wal", "-shm"):
        try:
            os.remove(path + s)
        except FileNotFoundError:
            pass


_SQLITE_MAGIC = b"SQLite format 3\x00"


def wal_image(head: bytes) -> bytes:
    """The first chunk of a template as a WAL-mode replica stores it: header bytes 18 and 19 (file format
    write/read version) = 2, which makes every connection open the file in WAL mode. Nothing else differs."""
    if len(head) >= 100 and head.startswith(_SQLITE_MAGIC) and head[18:20] != b"\x02\x02":
        return head[:18] + b"\x02\x02" + head[20:]
    return head


_SHM_DMS = 128  # unix VFS: byte of the -shm every connection with the wal-index mapped holds read-locked


def shm_in_use(path: str) -> bool:
    """True when some connection, in any process INCLUDING this one, still has the replica's wal-index
    mapped (SQLite's unix VFS holds a POSIX read lock on the -shm's DMS byte for as long as it does).
    An open-file-description lock conflicts with POSIX locks even when this process holds them, unlike
    F_GETLK / F_SETLK. Such a connection (a caller that did not close its own connection before
    release) keeps the per-inode wal-index of the old -shm: a WAL discard or an in-place delta would
    keep the inode and let it be shared by the next trajectory's connections in that process, or let
    the stale connection checkpoint its old WAL into the next lease's main file. False where OFD locks
    are not available (non-Linux): the check is skipped."""
    ofd = getattr(fcntl, "F_OFD_SETLK", None) if fcntl is not None else None
    if ofd is None:
        return False
    try:
        fd = os.open(path + "-shm", os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.fcntl(fd, ofd, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, _SHM_DMS, 1, 0))
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the OFD lock


def wal_size(path: str) -> int:
    """Bytes in the replica's `-wal` file (0 when there is none)."""
    try:
        return os.path.getsize(path + "-wal")
    except OSError:
        return 0


def hash_template(path: str, wal: bool) -> tuple[str, str, int]:
    """(sha256 of the template, sha256 of a clean replica of it, size in bytes)."""
    ht, hr, n = hashlib.sha256(), hashlib.sha256(), 0
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            ht.update(b)
            hr.update(wal_image(b) if n == 0 and wal else b)
            n += len(b)
    return ht.hexdigest(), hr.hexdigest(), n


def full_copy(rep: Any, src: str, want: str, wal: bool) -> int:
    """Copy the template `src` over the replica (via `<replica>.tmp` and an atomic rename) when its bytes
    hash to `want`; returns the bytes copied."""
    os.makedirs(os.path.dirname(rep.path), exist_ok=True)
    tmp = rep.path + ".tmp"
    h = hashlib.sha256()
    n = 0
    try:
        with open(src, "rb") as fi, open(tmp, "wb") as fo:
            while b := fi.read(1 << 20):
                h.update(b)
                fo.write(wal_image(b) if n == 0 and wal else b)
                n += len(b)
        _check_template(rep, src, h.hexdigest(), want)
        remove_sidecars(rep.path)
        os.replace(tmp, rep.path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return n


def wal_discard(rep: Any) -> tuple[int, int] | None:
    """WAL-mode reset: delete `-wal` and `-shm`, leaving the main file, which SQLite never wrote; returns
    (header bytes read, WAL bytes discarded), or None (the caller falls back to delta / full copy).

    Only when all of these hold:
    - `rep.pin_ok`: since the last reset, every open of the replica by its worker began the read-only
      pin on an empty WAL (WAL read-lock 0, held until the writer was closed), and the worker was never
      lost. While it is held no checkpoint can copy frames into the main file (walCheckpoint needs
      read-lock 0 exclusively; the worker's own checkpoints are off and their pragmas denied) and no
      close can checkpoint (that needs an EXCLUSIVE lock on the main file, which the pin's SHARED
      lock blocks; the pin is read-only and never checkpoints);
    - the main file's (size, mtime_ns, inode) is `rep.sig`, what it was right after the last reset,
      and there is no `-journal`;
    - `-wal` and `-shm` exist (the pin created them) and record no checkpoint: wal-index nBackfill ==
      nBackfillAttempted == 0 (the latter is set BEFORE a checkpoint writes a page), and, when the
      WAL has a header, its checkpoint sequence number is 0 and its salts equal the wal-index ones
      (a WAL restart after a full backfill changes them).
    """
    if not rep.pin_ok or os.path.exists(rep.path + "-journal"):
        return None
    try:
        st = os.stat(rep.path)
        if rep.sig != (st.st_size, st.st_mtime_ns, st.st_ino):
            return None
        with open(rep.path + "-shm", "rb") as f:
            shm = f.read(136)
        wal_n = os.path.getsize(rep.path + "-wal")
        hdr = b""
        if wal_n:
            with open(rep.path + "-wal", "rb") as f:
                hdr = f.read(32)
    except OSError:
        return None
    nread = len(shm) + len(hdr)
    if len(shm) < 136:
        return None
    n_backfill, n_attempted = struct.unpack_from("=I", shm, 96)[0], struct.unpack_from("=I", shm, 128)[0]
    if n_backfill or n_attempted:
        return None
    if wal_n:
        if len(hdr) < 32 or struct.unpack_from(">I", hdr, 12)[0] != 0 or hdr[16:24] != shm[32:40]:
            return None
    try:
        for s in ("-wal", "-shm"):
            os.remove(rep.path + s)
    except OSError:
        # half-removed: the delta / full reset that follows removes the rest and verifies the bytes
        return None
    return nread, wal_n


def delta_reset(
    rep: Any, src: str, want: str, *, block: int, max_bytes: float, wal: bool
) -> tuple[int, int] | None:
    """Reset in place by rewriting only the blocks that differ from the template. One read pass over
    both files collects the differing template blocks and hashes the template; nothing is written
    unless the hash equals `want` (else TemplateChanged). Afterwards the replica is byte-identical to
    the template (WAL mode: to the template with header bytes 18-19 = 2). Returns (bytes written, bytes
    read), or None (caller does a full copy) when the replica is missing or more than `max_bytes` of
    it differ."""
    blk = block
    try:
        fr = open(rep.path, "r+b")
    except OSError:
        return None
    with fr, open(src, "rb") as ft:
        h = hashlib.sha256()
        diffs: list[tuple[int, bytes]] = []
        pos = nread = ndiff = 0
        while a := ft.read(1 << 20):
            h.update(a)
            if pos == 0 and wal:
                a = wal_image(a)
            b = fr.read(len(a))
            nread += len(a) + len(b)
            if a != b:
                for off in range(0, len(a), blk):
                    if a[off : off + blk] != b[off : off + blk]:
                        diffs.append((pos + off, a[off : off + blk]))
                        ndiff += len(diffs[-1][1])
                if ndiff > max_bytes:
                    return None
            pos += len(a)
        nread += len(fr.read())  # replica longer than the template: its tail goes
        _check_template(rep, src, h.hexdigest(), want)
        remove_sidecars(rep.path)
        for off, data in diffs:
            fr.seek(off)
            fr.write(data)
        fr.truncate(pos)
    return ndiff, nread
