"""Secrets are never echoed: a store URL's password shows as ``***`` wherever the URL is printed.

Why: ``config get/set store`` print the value back, and a PostgreSQL URL may carry a password
(in its user info or as ``?password=``). Printing it would put it on screens, in shell
scrollback and in CI logs.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """``url`` with its password (user info or ``password=`` query) shown as ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostport = netloc.rpartition("@")
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
        query = [(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(parts.query, True)]
    except ValueError:
        return "<a URL that cannot be parsed; not shown>"
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="*"), parts.fragment))


def redact_config_value(key: str, shown: str) -> str:
    """A config value as ``config get`` prints it, with the store URL's password hidden."""
    if key != "store":
        return shown
    if len(shown) >= 2 and shown[0] == shown[-1] and shown[0] in "\"'":
        return shown[0] + redact_url(shown[1:-1]) + shown[0]
    return redact_url(shown)
