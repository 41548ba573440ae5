"""Text from outside (a dump, a log, a stack snapshot, a file name) made safe where it comes in, and inert
where it goes out.

- In: a lone surrogate (``"\\ud800"``, legal in a pickle and in JSON, illegal in UTF-8) would stop every
  output that encodes it, so ``safe_text`` makes it U+FFFD, once, where the text is read; a file name
  that is not UTF-8 (Python hands its bytes over as surrogate escapes) becomes ``\\xNN`` text
  (``path_text``).
- Out: ``shown`` is the one function every such string passes before it reaches a terminal or a
  one-line message. C0 and C1 controls (ESC, newline and tab included), DEL, and the invisible format
  characters that reorder or hide text (bidi overrides and isolates, zero-width characters, line and
  paragraph separators) are written as escapes (``\\x1b``, ``\\u202e``), so a dump can neither move the
  cursor, set a window title, nor make text read backwards. ``markdown_text`` and ``code_block`` do
  the same for a Markdown report, where text must also start no heading, list, table cell, link,
  code fence or HTML tag.
"""

from __future__ import annotations

import re

# Unicode's control (Cc), format (Cf), surrogate (Cs), line (Zl) and paragraph (Zp) separator
# characters, as of Unicode 15.1: none of them shows as itself, and some move or reorder what follows.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)


def is_number(text: str) -> bool:
    """Whether ``text`` is a non-empty run of ASCII digits 0-9, which ``int`` reads. ``str.isdigit`` also
    holds for ``"²"`` and other digits of Unicode that ``int`` refuses, and a dump may hold any of them."""
    return text.isascii() and text.isdigit()


def safe_text(text: str) -> str:
    """``text`` if it encodes as UTF-8; else with each lone surrogate replaced (pairs are joined)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def path_text(path: str) -> str:
    """A path as the OS gave it, as text that encodes: bytes that were not UTF-8 (surrogate escapes)
    become ``\\xNN``, anything else that cannot be encoded U+FFFD."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        path = re.sub("[\udc80-\udcff]", lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", path)
        return safe_text(path)
    return path


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a name that was not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: str) -> str:
    """``text`` as it may be shown: every control and invisible format character written as an escape.

    The one edge for every string from outside on its way to a terminal, an error line or a track
    name; plain text comes back as it is."""
    if text.isprintable() and text.isascii():
        return text
    return _UNSAFE.sub(_escape, text)


# What starts something in GitHub-flavoured Markdown: emphasis, code, links and images, headings,
# table cells, strikethrough, HTML tags and entities, and block markers at the start of a line.
_MARKDOWN_SPECIAL = re.compile(r"[\\`*_\[\]#!|~{}]|://|^[-+=>]|^(\d+)([.)])")
_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;", '"': "&quot;"}
# GitHub links ``#4`` to issue 4 and ``@name`` to a person wherever they appear in text (after
# Markdown is rendered, so escaping does not stop it); in a code span it does neither.
_AUTOLINKED = re.compile(r"(?<![\w`])(#\d+|@[A-Za-z0-9][\w-]*)")


def _markdown_escape(match: re.Match[str]) -> str:
    text = match.group()
    if text == "://":
        return "\\://"
    if match.group(1) is not None:  # ``1.`` at the start: an ordered list
        return match.group(1) + "\\" + match.group(2)
    return "\\" + text


def _markdown_plain(text: str) -> str:
    text = "".join(_HTML.get(c, c) for c in text) if any(c in text for c in _HTML) else text
    return _MARKDOWN_SPECIAL.sub(_markdown_escape, text)


def markdown_text(text: str) -> str:
    """``text`` for a line of Markdown (a paragraph, a list item, a table cell): ``shown``, then escaped
    so that it renders as the same characters and starts nothing; ``#4`` and ``@name`` in code spans."""
    parts = _AUTOLINKED.split(shown(text))
    # split keeps the matches at odd positions
    return "".join(f"`{part}`" if index % 2 else _markdown_plain(part) for index, part in enumerate(parts))


def code_block(lines: list[str], indent: str = "") -> list[str]:
    """Lines of a fenced code block: each line ``shown``, the fence longer than any run of backticks in
    them, so that no line can close it."""
    safe = [shown(line) for line in lines]
    longest = max((len(run) for line in safe for run in re.findall("`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [indent + fence, *(indent + line for line in safe), indent + fence]
