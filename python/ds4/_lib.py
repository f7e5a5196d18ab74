"""Finding and loading the shared libraries (libds4client.so.3, libds4.so.3).

Order: the file named by $DS4CLIENT_LIBRARY / $DS4_LIBRARY, then $DS4_LIBDIR/<soname>,
then the dynamic loader's search (LD_LIBRARY_PATH, the ldconfig cache: a `cmake --install`
into /usr/local or /usr is found this way).
"""
import ctypes
import os


class Ds4Error(Exception):
    """A failed call: code is the library's status, message its text."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


def load(soname, env_file):
    tried = []
    candidates = []
    if os.environ.get(env_file):
        candidates.append(os.environ[env_file])
    if os.environ.get("DS4_LIBDIR"):
        candidates.append(os.path.join(os.environ["DS4_LIBDIR"], soname))
    candidates.append(soname)
    for c in candidates:
        try:
            return ctypes.CDLL(c)
        except OSError as e:
            tried.append("%s (%s)" % (c, e))
    raise Ds4Error(
        "cannot load %s; tried: %s. Install ds4 (cmake --install) or set $DS4_LIBDIR or $%s"
        % (soname, "; ".join(tried), env_file)
    )


def fn(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def cstr(b):
    """NUL-terminated char array or pointer -> str."""
    if isinstance(b, (bytes, bytearray)):
        b = bytes(b).split(b"\0", 1)[0]
    return (b or b"").decode("utf-8", "replace")
