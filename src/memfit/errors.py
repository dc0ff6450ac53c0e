"""The one exception tree of memfit.

Every error a user can cause is a ``MemfitError``. The CLI catches it in one place, prints
``error: <message>`` on stderr and exits 1 (``UsageError`` exits 2). Anything else escaping is a bug.

    MemfitError
    ├── UsageError            bad command-line usage (exit 2)
    ├── InvalidSetupError     a training setup or number that cannot be right (collects every problem)
    ├── UnknownModelError     a model name that is in no catalog, cache or path (with close matches)
    ├── UnknownHardwareError  a GPU / Mac name that is not in the hardware catalog (with close matches)
    ├── SourceError           a config.json, model directory, safetensors header, dataset or Hub answer that
    │                         cannot be read
    └── MissingExtraError     an optional dependency is missing (names the pip install that brings it)

``str(exc)`` is always one printable line: messages quote text read from files and command lines, and a
newline, an ANSI escape or a bidi override in that text must not reach the terminal as itself.
"""

from __future__ import annotations

import unicodedata

# Unicode categories that print nothing visible or move the cursor: controls (C0, C1, ESC), format
# characters (bidi overrides like U+202E, zero-width joiners), surrogates, private use, line/paragraph breaks.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def printable(text: str) -> str:
    """`text` with every control, format or line-break character written as a visible escape (\\x1b, \\u202e)."""
    out = []
    for ch in str(text):
        if ch != " " and unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def shorten(value, limit: int = 80) -> str:
    """A printable, bounded rendering of a value for messages: text quoted ('abc…' (5,000 characters)),
    anything else as its repr (True, -3, [1, 2])."""
    text = value if isinstance(value, str) else repr(value)
    shown = printable(text[:limit])
    shown = repr(shown) if isinstance(value, str) else shown
    return shown if len(text) <= limit else f"{shown}… ({len(text):,} characters)"


class MemfitError(Exception):
    """Base of every error memfit reports to a user."""

    exit_code = 1

    def __str__(self) -> str:
        return printable(super().__str__())


class UsageError(MemfitError):
    exit_code = 2


class Problem:
    """One thing wrong with a request. ``template`` names options in braces (``{seq_len}``); each face renders
    them in its own vocabulary: ``--seq-len`` on the command line, ``seq_len`` in JSON and Python."""

    __slots__ = ("field", "template")

    def __init__(self, field: str | None, template: str):
        self.field, self.template = field, template

    def render(self, namer=lambda name: name) -> str:
        return self.template.format_map(_Names(namer))

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"Problem({self.field!r}, {self.template!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Problem) and (self.field, self.template) == (other.field, other.template)

    def __hash__(self) -> int:
        return hash((self.field, self.template))


class _Names(dict):
    def __init__(self, namer):
        super().__init__()
        self.namer = namer

    def __missing__(self, key: str) -> str:
        return self.namer(key)


class InvalidSetupError(MemfitError):
    """One or more problems with a setup; ``problems`` holds each one (a ``Problem`` or plain text)."""

    def __init__(self, problems: list | str | Problem):
        self.problems = [problems] if isinstance(problems, (str, Problem)) else list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))

    def render(self, namer) -> str:
        """The message with option names in a face's vocabulary (``flag_name`` for the CLI)."""
        return printable("; ".join(p.render(namer) if isinstance(p, Problem) else str(p) for p in self.problems))


class UnknownModelError(MemfitError):
    """``name``: what the user asked for (None when not one name); ``candidates``: the close catalog matches."""

    def __init__(self, message: str, *, name: str | None = None, candidates: tuple[str, ...] = ()):
        self.name, self.candidates = name, tuple(candidates)
        super().__init__(message)


class UnknownHardwareError(MemfitError):
    pass


class SourceError(MemfitError):
    pass


class MissingExtraError(MemfitError):
    pass


def close_matches(name: str, choices: list[str]) -> list[str]:
    """Up to three choices close to `name` (case-insensitive), in the spelling of `choices`."""
    import difflib

    key = str(name).lower()[:200]       # difflib is quadratic: a 5,000-character name must not stall it
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(key, list(lowered), n=3, cutoff=0.6)
    if not close:
        # Substring matches catch "llama-8b" -> "llama-3.1-8b" that difflib misses.
        key = key.replace("_", "-")
        close = [c for c in lowered if key and key in c][:3]
    return [lowered[c] for c in close]


def did_you_mean(name: str, choices: list[str], listing_command: str) -> str:
    """A ' (did you mean ...?)' hint plus the command that lists every choice."""
    close = close_matches(name, choices)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"{hint} (`{listing_command}` lists them)"
