"""How the CLI prints: rich's colours and tables, with no text from the lake, a file or an
error message read as markup.

rich reads `[...]` as a style and `:name:` as an emoji code. A code prompt's
`xs[i + 1] - xs[i]` printed as `xs - xs`; a model reason or eval-set name holding `[/x]`
made every later `model list` or `evalset list` crash (MarkupError); an error naming
`[cycle.domains]` lost the name. So values go into markup escaped (`plain`), table
cells go in as Text (`cell`), and emoji codes are off.
"""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.text import Text


def rich_console(stderr: bool = False, **kwargs) -> Console:
    return Console(stderr=stderr, emoji=False, **kwargs)


def plain(value: object) -> str:
    """`value` as text that rich prints as written inside a markup string."""
    return escape(str(value))


def cell(value: object) -> Text:
    """A table cell printed as written."""
    return Text(str(value))


def print_error(console: Console, message: object) -> None:
    """`error: message` on one line however long: soft wrap, so a path or a URL in it is
    never folded into pieces (a terminal still wraps it, and a copy or a grep of a piped
    log finds it whole)."""
    console.print(f"[red]error:[/red] {plain(message)}", soft_wrap=True)
