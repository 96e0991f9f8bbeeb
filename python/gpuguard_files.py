"""Files written safely by every gpuguard Python helper (stdlib only).

write_atomic creates a uniquely named temporary file in the target's own
folder (O_EXCL | O_NOFOLLOW: a link planted at a temporary name is never
followed), writes it, then renames it over the target (which replaces a
link there, never writes through it). The previous file stays whole on any
error; with durable=True the data and the folder entry are on disk before it
returns. The bash side's twin is gg_write_atomic in lib/common.sh.
"""
import os


def fsync_dir(folder):
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, data, mode=0o600, durable=False):
    """Replaces path with data (bytes, or text written as UTF-8); mode is set
    whatever the umask."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    folder = os.path.dirname(path) or "."
    while True:
        tmp = os.path.join(folder, ".%s.%s.tmp" % (os.path.basename(path), os.urandom(6).hex()))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            break
        except FileExistsError:
            continue
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(folder)
