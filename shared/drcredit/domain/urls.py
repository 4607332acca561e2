"""URL normalization for navigation credit and snippet eligibility (docs/method.md, "URL normalization").

Parsing is the standard library's ``urllib.parse``; the rules applied on top are exactly
the documented ones and nothing more (no percent-encoding or path-segment normalization),
so that two URLs match here exactly when they match for any other implementation of them.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import parse_qsl, urlencode, urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_DROPPED_PARAMS = frozenset({"gclid", "fbclid"})


# Cached: a group's rollouts name the same few dozen URLs thousands of times.
@lru_cache(maxsize=1 << 16)
def norm_url(url: str) -> str:
    """Return the canonical form of ``url``; two URLs match when their forms are equal.

    A URL with no scheme (``example.com/page``) is read as ``http://example.com/page``,
    which is what an agent that passes bare domains to its visit tool means. The empty
    string normalizes to the empty string, which :func:`urls_match` never matches. Text
    that is no URL at all (an unbalanced ``[`` in its host, say) is its own trimmed form:
    it matches only itself.
    """
    text = url.strip()
    if not text:
        return ""
    if "://" not in text:
        text = "http:" + text if text.startswith("//") else "http://" + text
    try:
        parts = urlsplit(text)
    except ValueError:
        return url.strip()
    scheme = parts.scheme.lower()
    if scheme == "https":
        scheme = "http"
    netloc = _normalize_netloc(parts.netloc, parts.scheme.lower())
    path = parts.path
    if path.endswith("/"):
        path = path[:-1]
    pairs = [
        (name, value)
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if not name.startswith("utm_") and name not in _DROPPED_PARAMS
    ]
    query = urlencode(sorted(pairs))
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


def _normalize_netloc(netloc: str, original_scheme: str) -> str:
    userinfo, _, hostport = netloc.rpartition("@")
    host, port = hostport, ""
    if hostport.startswith("["):  # IPv6 literal: [::1]:8080
        close = hostport.find("]")
        host, rest = hostport[: close + 1], hostport[close + 1 :]
        port = rest[1:] if rest.startswith(":") else ""
    elif ":" in hostport:
        host, _, port = hostport.rpartition(":")
    host = host.lower()
    if host.startswith("www."):
        host = host[4:]
    if port and port.isdigit() and int(port) == _DEFAULT_PORTS.get(original_scheme):
        port = ""
    result = host + (f":{port}" if port else "")
    return f"{userinfo}@{result}" if userinfo else result


def urls_match(a: str, b: str) -> bool:
    """Whether two URLs name the same page under the documented rules (blank URLs match nothing)."""
    na = norm_url(a)
    return bool(na) and na == norm_url(b)
