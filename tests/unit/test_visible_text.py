"""`visible`: text a publisher controls is shown with exactly its unsafe characters escaped (control,
bidirectional, invisible), and escaping twice changes nothing (every human view of the real CLI:
tests/integration/test_terminal_text.py)."""

import pytest

from ftrain.console.visible_text import visible


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, é, 中文, 🙂 and \\ stay", "plain text, é, 中文, 🙂 and \\ stay"),
        ("a\nb\rc\td", r"a\nb\rc\td"),
        ("\x1b[31mred\x1b[0m", r"\x1b[31mred\x1b[0m"),
        ("\x00\x7f\x85\x9f", r"\x00\x7f\x85\x9f"),
        ("abc\u202edef\u2066\u2069\u061c", r"abc\u202edef\u2066\u2069\u061c"),
        ("zero\u200bwidth\u200d\ufeff\u2028\u2029", r"zero\u200bwidth\u200d\ufeff\u2028\u2029"),
        ("tag \U000e0041 and lone \ud800", r"tag \U000e0041 and lone \ud800"),
    ],
)
def test_visible_escapes_exactly_the_unsafe_characters(text: str, shown: str) -> None:
    assert visible(text) == shown
    assert visible(shown) == shown  # escaping twice changes nothing: a table may escape before measuring
