"""Text from a dump made safe to print and write: a lone surrogate (``"\\ud800"``, legal in a pickle and
in JSON, illegal in UTF-8) would stop every output that encodes it, so it becomes U+FFFD, once, where
the text comes in."""

from __future__ import annotations


def safe_text(text: str) -> str:
    """``text`` if it encodes as UTF-8; else with each lone surrogate replaced (pairs are joined)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
