"""A minimal PEP 517 build backend for the pure-Python ds4 package.

It writes a wheel (a zip with the package, METADATA, WHEEL and RECORD) using only the
standard library, so installing needs no build dependency from a package index.
"""
import base64
import hashlib
import os
import re
import tarfile
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "ds4"


def _project():
    text = open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8").read()
    section = text.split("[project]", 1)[1]

    def field(key):
        m = re.search(r'^%s\s*=\s*"([^"]*)"' % key, section, re.M)
        return m.group(1) if m else ""

    return field("name"), field("version"), field("description"), field("requires-python")


def _metadata():
    name, version, summary, requires_python = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version, "Summary: " + summary]
    if requires_python:
        lines.append("Requires-Python: " + requires_python)
    return "\n".join(lines) + "\n"


def _files():
    base = os.path.join(_ROOT, _PACKAGE)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py") or f == "py.typed":
                full = os.path.join(dirpath, f)
                yield full, os.path.relpath(full, _ROOT).replace(os.sep, "/")


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _wheel(wheel_directory, editable):
    name, version, _, _ = _project()
    dist_info = "%s-%s.dist-info" % (name, version)
    wheel_name = "%s-%s-py3-none-any.whl" % (name, version)
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data):
            z.writestr(arcname, data)
            records.append(_record_line(arcname, data))

        if editable:  # a .pth file puts the source tree on sys.path
            add(name + ".pth", (_ROOT + "\n").encode())
        else:
            for full, arcname in _files():
                add(arcname, open(full, "rb").read())
        add(dist_info + "/METADATA", _metadata().encode())
        add(dist_info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: ds4_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        record = dist_info + "/RECORD"
        z.writestr(record, "\n".join(records + [record + ",,"]) + "\n")
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, editable=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, editable=True)


def build_sdist(sdist_directory, config_settings=None):
    name, version, _, _ = _project()
    base = "%s-%s" % (name, version)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for rel in ["pyproject.toml", "_build/ds4_build.py"]:
            t.add(os.path.join(_ROOT, rel), base + "/" + rel)
        for full, arcname in _files():
            t.add(full, base + "/" + arcname)
        info = tarfile.TarInfo(base + "/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        import io
        t.addfile(info, io.BytesIO(data))
    return base + ".tar.gz"
