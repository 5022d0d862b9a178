"""A configuration file the node re-reads when it changes: the tokens file (``--auth-file``,
node/auth.py) and the quotas file (``--quota-file``, node/quotas.py).

The file is parsed at start (a file that does not parse stops the node with a message naming
it) and again whenever its modification time or size changes; a new version that does not
parse, or a file that cannot be read, keeps the last good content, logs the problem, and is
reported by :attr:`WatchedFile.error` (``/v1/health`` says ``degraded``) until it is fixed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["WatchedFile"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class WatchedFile(Generic[T]):
    """``parse`` turns the file's bytes into a value or raises ValueError naming the problem;
    ``flag`` (``--auth-file``) and ``what`` (``tokens``) make the messages."""

    def __init__(self, path: str, parse: Callable[[bytes], T], flag: str, what: str) -> None:
        self.path = path
        self._parse = parse
        self._flag = flag
        self._what = what
        self._stamp: tuple[int, int] | None = None
        self.error = ""
        try:
            self.value: T = self._load(None)
        except OSError as exc:  # at start: stop, naming the flag and the file
            raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from exc

    def _load(self, previous: T | None) -> T:
        st = os.stat(self.path)
        with open(self.path, "rb") as f:
            raw = f.read()
        try:
            value = self._parse(raw)
        except ValueError as exc:
            if previous is None:
                raise ValueError(f"{self._flag} {self.path}: {exc}") from exc
            self.error = f"{self._flag} {self.path} does not parse ({exc}); old {self._what} kept"
            log.error("%s", self.error)
            self._stamp = (st.st_mtime_ns, st.st_size)
            return previous
        self._stamp = (st.st_mtime_ns, st.st_size)
        self.error = ""
        return value

    def current(self) -> T:
        """The content, re-read first if the file changed."""
        try:
            st = os.stat(self.path)
            if (st.st_mtime_ns, st.st_size) != self._stamp:
                self.value = self._load(self.value)
        except OSError as exc:
            self.error = f"{self._flag} {self.path} cannot be read ({exc}); old {self._what} kept"
        return self.value
