"""Atomic file and directory writes, directory locks, file digests, and run provenance (package versions, git
commit)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from mydecide.errors import UserError

TRACKED_PACKAGES = ("mydecide", "torch", "transformers", "peft", "accelerate", "datasets", "datasketch")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers never see a half-written file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers never see a half-written file."""
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual permissions
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_figure(path: str | Path, fig: Any) -> None:
    """Write a matplotlib figure to ``path`` as a PNG (110 dpi) atomically, and close the figure whatever happens."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def refuse_link(path: str | Path) -> None:
    """Refuse (one line) a symbolic link where an output goes: replacing it would drop the link, and writing through
    it would change a file this command was never given."""
    if Path(path).is_symlink():
        raise UserError(
            f"{path}: is a symbolic link; an output is written as a plain file: remove it or choose another"
        )


def _leftover(name: str, owned: Collection[str]) -> bool:
    """Whether ``name`` is what an interrupted atomic write of an owned file leaves (``.NAME.XXXX.tmp``,
    ``.NAME.tmp``); any other hidden file, ``.draft.tmp`` included, is the user's."""
    return name.endswith(".tmp") and any(name.startswith(f".{own}.") for own in owned)


def foreign_entries(directory: Path, owned: Collection[str] = ()) -> list[str]:
    """The paths in ``directory`` (relative, sorted) that are not ``owned``, looked at all the way down: a folder
    is owned whole when its name is, is looked into when an owned path lies inside it (``train/part-00000.jsonl``
    owns ``train/`` and that file only), and is foreign otherwise; leftovers of an interrupted atomic write of an
    owned file are not counted (``owned=()``: every entry)."""
    found: list[str] = []
    for p in directory.iterdir():
        if p.name in owned or _leftover(p.name, owned):
            continue
        inside = [own.split("/", 1)[1] for own in owned if own.startswith(p.name + "/")]
        if inside and p.is_dir() and not p.is_symlink():
            found += [f"{p.name}/{name}" for name in foreign_entries(p, inside)]
        else:
            found.append(p.name)
    return sorted(found)


def unshare(path: str | Path) -> None:
    """Give a file that this process appends to an inode of its own when another name shares it (a run copied with
    ``cp -al``): appending would otherwise write into the other copy too."""
    path = Path(path)
    if path.is_file() and not path.is_symlink() and path.stat().st_nlink > 1:
        atomic_write_bytes(path, path.read_bytes())


@contextmanager
def staged_directory(target: str | Path, owned: Collection[str]) -> Iterator[Path]:
    """A new directory beside ``target`` to fill; when the block ends without error it replaces ``target`` whole.

    An error or an interrupt (even kill -9) at any point leaves ``target`` as it was or, once swapped, complete:
    never a mix of two runs. ``target`` may hold only the ``owned`` paths (and what their interrupted atomic writes
    left), so nothing else is ever deleted (``train/part-00000.jsonl`` owns that file of ``train/`` only).
    Directories that a killed run left beside ``target`` are removed first.
    """
    target = Path(os.path.realpath(target))  # a symlink's directory is replaced, not the link; "." gets a name
    if target.exists():
        if not target.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(target))
        foreign = foreign_entries(target, owned)
        if foreign:
            raise FileExistsError(
                f"{target}: holds {', '.join(foreign[:5])}, which this command did not write; "
                "choose an empty or new output directory"
            )
    above = next(p for p in target.parents if p.exists())
    if not above.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"not a directory, so {target} cannot be made there", str(above))
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.staging-"
    for stale in target.parent.glob(prefix + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=prefix))
    try:
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp creates 0700; outputs get the usual permissions
        yield staging
        if target.exists():
            _swap(staging, target)  # staging now holds the previous outputs
        else:
            os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap(new: Path, target: Path) -> None:
    """Exchange two directories in one step (Linux renameat2); elsewhere, two renames close together."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = getattr(libc, "renameat2", None)
        if renameat2 is not None:
            renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            at_fdcwd, rename_exchange = -100, 2
            if renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(target), rename_exchange) == 0:
                return
            code = ctypes.get_errno()
            if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # else: the file system cannot swap
                raise OSError(code, os.strerror(code), str(target))
    aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.staging-old-"))
    os.rename(target, aside / target.name)
    os.rename(new, target)
    os.rename(aside / target.name, new)
    aside.rmdir()


def holds(directory: str | Path, path: str | Path) -> bool:
    """Whether ``path`` is ``directory`` or lies inside it, symlinks and ``..`` resolved: what a command that
    replaces ``directory`` whole would take with it (an input, the working directory)."""
    outer, inner = Path(os.path.realpath(directory)), Path(os.path.realpath(path))
    return inner == outer or outer in inner.parents


class DirectoryBusy(UserError, RuntimeError):
    """Another process holds the lock of a run or output directory (a :class:`UserError`: wait for it or choose
    another directory; still a ``RuntimeError``, as it was)."""


def _holder(path: Path) -> str:
    """What the lock file at ``path`` says about its holder (``mydecide train, pid 123``), or ``?``."""
    try:
        with open(path, "rb") as handle:  # a lock file is never followed: it is checked to be no symlink first
            return handle.read(200).decode("utf-8", "replace").strip() or "?"
    except OSError:  # gone meanwhile, or (Windows) its locked bytes cannot be read
        return "?"


@contextmanager
def directory_lock(directory: str | Path, command: str) -> Iterator[None]:
    """Hold an advisory lock on ``directory`` for the block, so that a second process that writes there fails at
    once with one line naming the holder's pid instead of interleaving with the first.

    The lock is a hidden file beside the directory (``.NAME.lock``: prepare swaps its output directory whole, so a
    lock inside it would be swapped away), locked with ``filelock`` (``flock`` on Unix, ``msvcrt`` locking on
    Windows) and so released by the system however the holder ends, kill -9 included. A lock file whose holder has
    gone is simply taken over; a symbolic link where the lock file goes is refused (it would lock, and write, some
    other file). The file is removed on release, while still locked; a process that opened it just before then holds
    a lock on a removed file, which the inode check below tells apart, and it tries again.
    """
    import filelock

    target = Path(os.path.realpath(directory))
    above = next(p for p in target.parents if p.exists())
    if not above.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"not a directory, so {target} cannot be made there", str(above))
    target.parent.mkdir(parents=True, exist_ok=True)
    path = target.parent / f".{target.name}.lock"
    holder = f"mydecide {command}, pid {os.getpid()}".encode()
    held: list[os.stat_result] = []

    def mark(fd: int) -> None:  # runs once the lock is held: say who holds it
        held.append(os.fstat(fd))
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, holder)

    while True:
        if path.is_symlink():
            raise UserError(f"{path} is a symbolic link; the lock file of {directory} must be a plain file: remove it")
        lock = filelock.FileLock(path, blocking=False, thread_local=False, on_acquired=mark)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise DirectoryBusy(
                f"{directory}: in use by another process ({_holder(path)}); wait for it to end or choose another "
                "directory"
            ) from None
        try:
            same = os.path.samestat(held[-1], os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False  # the previous holder removed the file between our open and our lock
        if same:
            break
        lock.release()
    try:
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # while still locked, so no one else can hold this inode by then
        except PermissionError:  # Windows removes no open file: it stays, unlocked, for the next holder
            pass
        finally:
            lock.release()  # even when an interrupt lands in the unlink: the lock never outlives the block


@contextmanager
def writing_tensors(path: str | Path) -> Iterator[None]:
    """Tell a safetensors write that failed (its own error type, with the system's code in the text: a full disk)
    as the ``OSError`` it was, naming ``path``, so that commands say it in one line."""
    try:
        yield
    except Exception as err:
        if type(err).__name__ != "SafetensorError":
            raise
        found = re.search(r"os error (\d+)|code: (\d+)", str(err))
        if found is None:
            raise UserError(f"{path}: could not be written ({' '.join(str(err).split())})") from None
        code = int(found.group(1) or found.group(2))
        raise OSError(code, os.strerror(code), str(path)) from None


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    """The commit of the checkout this package runs from (None outside a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance() -> dict[str, Any]:
    return {"versions": package_versions(), "git_commit": git_commit()}
