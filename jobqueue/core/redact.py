"""Hides passwords in URLs before a message reaches a terminal, a log line or a stored error."""

from __future__ import annotations

import re

__all__ = ["redact"]

# NOTE: the password part of any scheme://user:password@ in a message; a URL from the
# environment (a proxy, the provider, the database) may carry one.
_URL_PASSWORD = re.compile(r"""(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^\s'"]*@""")


def redact(message: str) -> str:
    """Returns `message` with every URL's password replaced by `***`."""
    return _URL_PASSWORD.sub(r"\g<head>***@", message)
