"""URL normalization (docs/method.md, "URL normalization"), one row per rule."""

from __future__ import annotations

import pytest

from drcredit.domain.urls import norm_url, urls_match

CASES = [
    # (a, b, match?, rule)
    ("  https://example.com/a  ", "https://example.com/a", True, "trim whitespace"),
    ("HTTPS://EXAMPLE.COM/a", "https://example.com/a", True, "lower-case scheme and host"),
    ("https://example.com/A", "https://example.com/a", False, "path keeps its case"),
    ("http://example.com/a", "https://example.com/a", True, "http and https are equal"),
    ("https://www.example.com/a", "https://example.com/a", True, "drop a leading www."),
    ("https://wwwexample.com/a", "https://example.com/a", False, "only the www. label is dropped"),
    ("https://shop.www.example.com/a", "https://shop.example.com/a", False, "www. only when leading"),
    ("http://example.com:80/a", "http://example.com/a", True, "drop default http port"),
    ("https://example.com:443/a", "https://example.com/a", True, "drop default https port"),
    ("https://example.com:8443/a", "https://example.com/a", False, "other ports stay"),
    ("https://example.com/a#section-2", "https://example.com/a", True, "drop the fragment"),
    ("https://example.com/a/", "https://example.com/a", True, "drop a trailing slash"),
    ("https://example.com/", "https://example.com", True, "root path becomes empty"),
    ("https://example.com/a?utm_source=x&utm_medium=y", "https://example.com/a", True, "drop utm_ parameters"),
    ("https://example.com/a?gclid=1&fbclid=2", "https://example.com/a", True, "drop gclid and fbclid"),
    ("https://example.com/a?b=2&a=1", "https://example.com/a?a=1&b=2", True, "sort remaining parameters"),
    ("https://example.com/a?id=1", "https://example.com/a?id=2", False, "other parameters are kept"),
    ("https://example.com/a?utm_source=x&id=7", "https://example.com/a?id=7", True, "utm dropped, others kept"),
    ("https://example.com/a", "https://example.org/a", False, "different hosts"),
    ("https://www.Example.com:443/a/?utm_campaign=z&q=1#top", "http://example.com/a?q=1", True, "all rules together"),
    ("example.com/a", "https://example.com/a", True, "a scheme-less URL reads as http"),
    ("", "", False, "blank URLs match nothing"),
]


@pytest.mark.parametrize(("a", "b", "expected", "rule"), CASES, ids=[c[3] for c in CASES])
def test_url_matching(a: str, b: str, expected: bool, rule: str) -> None:
    assert urls_match(a, b) is expected, (rule, norm_url(a), norm_url(b))


def test_normal_form_is_stable() -> None:
    once = norm_url("https://www.Example.com:443/a/?b=2&a=1&utm_x=3#f")
    assert once == "http://example.com/a?a=1&b=2"
    assert norm_url(once) == once


def test_text_that_is_no_url_matches_only_itself() -> None:
    """urllib cannot split an unbalanced IPv6 bracket: the trimmed text is its own form."""
    assert norm_url(" http://[::1/x ") == "http://[::1/x"
    assert urls_match("http://[::1/x", "http://[::1/x") and not urls_match("http://[::1/x", "http://[::1]/x")
