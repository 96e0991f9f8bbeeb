"""Files written safely by every gpuguard Python helper (stdlib only).

write_atomic creates a uniquely named temporary file in the target's own
folder (O_EXCL | O_NOFOLLOW: a link planted at a temporary name is never
followed), writes it, then renames it over the target (which replaces a
link there, never writes through it). The previous file stays whole on any
error; with durable=True the data and the folder entry are on disk before it
returns. The bash side's twin is gg_write_atomic in lib/common.sh.

write_named writes where a user pointed an option (a report's --out): a
regular file or a new name gets write_atomic; anything else that is already
there is never replaced (see its docstring).
"""
import errno
import os
import re
import stat


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


class _NoTemporary(OSError):
    """write_atomic could not create its temporary file: the folder is
    missing, not a folder, or closed to us. Nothing was created."""


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
        except OSError as e:
            raise _NoTemporary(e.errno, e.strerror, tmp) from None
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


class Refused(Exception):
    """write_named will not write there; the message says why, in one line."""


# Names of a descriptor this process already holds: "-", /dev/stdout and
# /dev/stderr, /dev/fd/N and /proc/self/fd/N (bash's >(...) hands one over).
_DESCRIPTOR_NAMES = {"-": 1, "/dev/stdout": 1, "/dev/stderr": 2}
_DESCRIPTOR_RE = re.compile(r"/(?:dev|proc/self)/fd/(\d{1,6})")


def descriptor_of(path):
    """The descriptor a name stands for ("-" and /dev/stdout: 1), else None."""
    if path in _DESCRIPTOR_NAMES:
        return _DESCRIPTOR_NAMES[path]
    m = _DESCRIPTOR_RE.fullmatch(path)
    return int(m.group(1)) if m else None


def _write_fd(fd, data):
    with os.fdopen(fd, "wb", closefd=False) as f:
        f.write(data)


def write_named(path, data, mode=0o644):
    """Writes data (bytes, or text as UTF-8) to the place a user named, as a
    shell's > would, but without ever destroying what is there:
    - "-", /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: written to
      that descriptor of this process (Refused when it is not open);
    - a new name or a regular file: write_atomic (created or replaced whole);
      Refused, naming the folder, when that folder is missing or not ours
      to write in;
    - a FIFO or a character device (/dev/null, a terminal): written through
      it, opened without O_CREAT, O_TRUNC or following a link, and checked
      after the open (a name swapped for a regular file meanwhile, maybe a
      hard link to someone else's file, is not written into);
    - a symbolic link: Refused, neither followed (it may lead where the user
      did not mean) nor replaced (it is theirs);
    - a folder, a block device (a disk), a socket: Refused.
    OSError for what fails while writing (disk full, /dev/full, no reader)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd = descriptor_of(path)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise Refused("%s: descriptor %d is not open" % (path, fd)) from None
        _write_fd(fd, data)
        return
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None           # write_atomic's temporary file says why
    if st is None or stat.S_ISREG(st.st_mode):
        try:
            write_atomic(path, data, mode=mode)
        except _NoTemporary as e:
            _refuse_folder(path, e)
        return
    if stat.S_ISLNK(st.st_mode):
        try:
            target = " (to %s)" % os.readlink(path)
        except OSError:
            target = ""
        raise Refused("%s is a symbolic link%s, neither followed nor replaced: name the file itself"
                      % (path, target))
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        raise Refused("%s is %s; give a file name" % (path, _kind(st.st_mode)))
    # a FIFO blocks here until it has a reader, as a shell's > does
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        now = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(now) or stat.S_ISCHR(now)):
            raise Refused("%s changed while it was opened (now %s); nothing was written" % (path, _kind(now)))
        _write_fd(fd, data)
    finally:
        os.close(fd)


def _refuse_folder(path, err):
    """Refused naming the folder the user gave (not the temporary file) when
    it is missing or closed to us; err raised again for anything else."""
    folder = os.path.dirname(path) or "."
    if err.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(folder):
        if os.path.lexists(folder):
            raise Refused("%s: %s is not a folder" % (path, folder)) from None
        raise Refused("%s: folder %s does not exist" % (path, folder)) from None
    if err.errno in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS):
        raise Refused("%s: folder %s is not writable%s" % (
            path, folder, " (read-only file system)" if err.errno == errno.EROFS else "")) from None
    raise err


def _kind(st_mode):
    for test, word in ((stat.S_ISDIR, "a folder"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device")):
        if test(st_mode):
            return word
    return "not a file"
