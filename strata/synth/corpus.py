"""The training text of our made-up vocabularies: CPython standard-library sources (PSF licence).

A fixed, sorted list of top-level stdlib modules (none removed in 3.12/3.13, no machine-specific
`_sysconfigdata*`), read from this interpreter's `sysconfig.get_paths()["stdlib"]`, joined with one newline.
Another Python has other sources, so the text is reproducible only on the recorded version; `Corpus.recorded`
says whether this one matches byte for byte (its SHA-256), and vocabularies meant to stay fixed are stored as
data rather than retrained.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass

RECORDED_PYTHON = "3.11.7"
# SHA-256 of the joined text of STDLIB_FILES on RECORDED_PYTHON
RECORDED_SHA256 = "903e3545bf3bdda8392b3f7f4c3ccbaeba6ed6f7df4ee7154b8dbcfb9a727c8a"
STDLIB_FILES = (
    "__future__.py", "__hello__.py", "_aix_support.py", "_bootsubprocess.py", "_collections_abc.py",
    "_compat_pickle.py", "_compression.py", "_markupbase.py", "_osx_support.py", "_py_abc.py",
    "_pydecimal.py", "_pyio.py", "_sitebuiltins.py", "_strptime.py", "_threading_local.py",
    "_weakrefset.py", "abc.py", "antigravity.py", "argparse.py", "ast.py", "base64.py", "bdb.py",
    "bisect.py", "bz2.py", "cProfile.py", "calendar.py", "cmd.py", "code.py", "codecs.py", "codeop.py",
    "colorsys.py", "compileall.py", "configparser.py", "contextlib.py", "contextvars.py", "copy.py",
    "copyreg.py", "csv.py", "dataclasses.py", "datetime.py", "decimal.py", "difflib.py", "dis.py",
    "doctest.py", "enum.py", "filecmp.py", "fileinput.py", "fnmatch.py", "fractions.py", "ftplib.py",
    "functools.py", "genericpath.py", "getopt.py", "getpass.py", "gettext.py", "glob.py", "graphlib.py",
    "gzip.py", "hashlib.py", "heapq.py", "hmac.py", "imaplib.py", "inspect.py", "io.py", "ipaddress.py",
    "keyword.py", "linecache.py", "locale.py", "lzma.py", "mailbox.py", "mimetypes.py", "modulefinder.py",
    "netrc.py", "ntpath.py", "nturl2path.py", "numbers.py", "opcode.py", "operator.py", "optparse.py",
    "os.py", "pathlib.py", "pdb.py", "pickle.py", "pickletools.py", "pkgutil.py", "platform.py",
    "plistlib.py", "poplib.py", "posixpath.py", "pprint.py", "profile.py", "pstats.py", "pty.py",
    "py_compile.py", "pyclbr.py", "pydoc.py", "queue.py", "quopri.py", "random.py", "reprlib.py",
    "rlcompleter.py", "runpy.py", "sched.py", "secrets.py",
)   # 104 files, 2,997,264 bytes on 3.11.7


@dataclass(frozen=True, slots=True)
class Corpus:
    text: str
    files: tuple[str, ...]
    python_version: str
    sha256: str

    def __post_init__(self):
        assert self.files == tuple(sorted(self.files)), "corpus files must be in sorted order"

    @property
    def recorded(self) -> bool:
        """True when this is byte for byte the recorded corpus (same file list, same Python sources)."""
        return self.files == STDLIB_FILES and self.sha256 == RECORDED_SHA256


def stdlib_corpus(files: tuple[str, ...] = STDLIB_FILES, max_bytes: int | None = None) -> Corpus:
    """The stdlib training text; `max_bytes` keeps the first files whose sizes fit (for quick tests)."""
    root = sysconfig.get_paths()["stdlib"]
    parts, total, used = [], 0, []
    for name in sorted(files):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"stdlib file {name} is missing from {root} (this is Python "
                                    f"{platform.python_version()}; the corpus was recorded on {RECORDED_PYTHON})")
        with open(path, encoding="utf-8") as f:
            s = f.read()
        if max_bytes is not None and total + len(s.encode("utf-8")) > max_bytes:
            break
        parts.append(s)
        used.append(name)
        total += len(s.encode("utf-8"))
    text = "\n".join(parts)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Corpus(text, tuple(used), platform.python_version(), digest)
