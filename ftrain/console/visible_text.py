"""The one rule for text on its way to a person: every character that is not itself visible text is shown as
an escape.

Event fields are written by whoever can publish to the stream, and a terminal obeys what they carry: a line
feed starts a forged line, ESC sequences hide or recolour the real verdict, bidirectional controls reorder it.
So every human-readable line — stdout and the one-line errors — passes through `visible`, terminal or not
(what is piped today is shown in a terminal tomorrow); `--json` output is not text for a person and keeps the
stored strings. Stdlib only: the error path imports it before anything else is loaded.
"""

import unicodedata

_NAMED = {"\n": r"\n", "\r": r"\r", "\t": r"\t"}
_SEPARATORS = ("Zl", "Zp")  # U+2028, U+2029: line breaks to some terminals and most editors


def _escape(char: str) -> str:
    """`\\n`, `\\x1b`, `\\u202e`, `\\U000e0041`: the character's Python escape."""
    if named := _NAMED.get(char):
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    """Control (C0, DEL, C1), format (bidirectional embeddings, overrides and isolates, zero-width
    characters, the BOM, tags), surrogate, private-use or unassigned, or a line or paragraph separator."""
    category = unicodedata.category(char)
    return category[0] == "C" or category in _SEPARATORS


def visible(text: str) -> str:
    """`text` with every unsafe character escaped; printable text (any script, emoji, spaces) unchanged.
    Backslashes are left alone, so escaping is idempotent (a table escapes its cells before measuring them,
    and the line is escaped again on output) and cannot be undone into a raw control character."""
    if text.isprintable():  # false for exactly the "C" and "Z" categories but the ASCII space: fast path
        return text
    return "".join(_escape(c) if _unsafe(c) else c for c in text)
