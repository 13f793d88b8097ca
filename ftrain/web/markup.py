"""Every piece of text on its way into a page: shown visibly (`visible`: control, bidirectional and invisible
characters as escapes), then HTML-escaped, quotes included, so it is safe in element content and in quoted
attribute values alike. Event fields are written by whoever can publish to the stream: no field reaches a page
any other way. Pages carry no inline script, so no text is ever placed in a script context."""

import html
from urllib.parse import quote

from ftrain.console.visible_text import visible


def text(value: object) -> str:
    """`value` as HTML text."""
    return html.escape(visible(str(value)), quote=True)


def lines(value: str) -> str:
    """Several lines (a `<pre>` block) as HTML text: each line made visible on its own."""
    return "\n".join(text(line) for line in value.split("\n"))


def path_part(value: str) -> str:
    """A run id or number as one percent-encoded path segment, escaped for an attribute."""
    return html.escape(quote(value, safe=""), quote=True)


def run_href(run_id: str) -> str:
    """The run's page."""
    return f"/runs/{path_part(run_id)}"


def event_href(run_id: str, stream_seq: int) -> str:
    """One event's page."""
    return f"{run_href(run_id)}/events/{stream_seq}"
