"""Files of a store that several threads, processes and hosts share: atomic replacement, and
the temporaries that a writer killed mid-write leaves behind."""
from __future__ import annotations

import errno
import os
import secrets
import socket
import stat
import time

__all__ = ["atomic_write", "cache_dir", "os_error_text", "read_regular", "remove_stale_temporaries",
           "NotRegularFile", "TooLarge"]


class NotRegularFile(OSError):
    """A store path that is not a regular file (a FIFO, a device, a directory, a socket)."""


class TooLarge(OSError):
    """A store file larger than its bound (the manifest's recorded size, or a sane maximum)."""


def read_regular(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` of them.

    A store is a directory others may write into (or a user may point anywhere), so what
    is read there is checked on the descriptor actually opened: O_NONBLOCK keeps a FIFO
    from blocking the open, fstat refuses anything but a regular file (a FIFO, /dev/zero
    behind a symlink, a directory), and the read stops one byte past `max_bytes` (a file
    that grows while read is refused too).  Symlinks to regular files are followed.
    Raises FileNotFoundError, NotRegularFile, TooLarge or another OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        if st.st_size > max_bytes:
            raise TooLarge(errno.EFBIG, f"{st.st_size} bytes, more than the {max_bytes} expected", path)
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise TooLarge(errno.EFBIG, f"more than the {max_bytes} bytes expected (it grew while read)", path)
        return data
    finally:
        os.close(fd)


def cache_dir() -> str:
    """Per-user cache directory (platformdirs), or ACLNN_IREE_CACHE when set: the compile
    cache of modules built on first use, and the compiled templates (render.py)."""
    env = os.environ.get("ACLNN_IREE_CACHE")
    if env:
        return env
    import platformdirs
    return platformdirs.user_cache_dir("aclnn-iree")


def os_error_text(e: OSError) -> str:
    """An OSError as '[Errno 13] EACCES: Permission denied'."""
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"[Errno {e.errno}] {name}: {e.strerror}" if name else str(e)


# Temporaries of atomic writes live beside their target, named for their writer so that a
# writer killed mid-write (SIGKILL) leaves something a later build can recognise and remove.
_TMP_PREFIX = ".tmp-"


_STALE_TMP_SECONDS = 24 * 3600


def _host_tag() -> str:
    """This host's name as it appears in temporaries' names ('-' separates their fields)."""
    return socket.gethostname().replace("-", "_")[:40]


def _tmp_name(path: str) -> str:
    return os.path.join(os.path.dirname(path),
                        f"{_TMP_PREFIX}{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}-{os.path.basename(path)}")


def atomic_write(path: str, data: bytes):
    """Writes `data` to `path` through a temporary file beside it and os.replace (readers
    never see half a file).  The file is created with mode 0666 less the umask, like any
    other file the user writes (mkstemp's 0600 would hide a shared store from other users)."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = _tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temporaries(directory: str) -> list:
    """Removes the temporaries of writers that died (this host, dead pid) or that are over a
    day old (any host: a store on a shared disk); returns the paths removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host = _host_tag()
    now = time.time()
    for name in names:
        if not name.startswith(_TMP_PREFIX):
            continue
        path = os.path.join(directory, name)
        parts = name[len(_TMP_PREFIX):].split("-", 2)
        try:
            dead = parts[0] == host and not _pid_alive(int(parts[1]))
            old = now - os.stat(path).st_mtime > _STALE_TMP_SECONDS
            if dead or old:
                os.unlink(path)
                removed.append(path)
        except (ValueError, IndexError, OSError):
            continue
    return removed
