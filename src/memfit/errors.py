"""The one exception tree of memfit.

Every error a user can cause is a ``MemfitError``. The CLI catches it in one place, prints
``error: <message>`` on stderr and exits 1 (``UsageError`` exits 2). Anything else escaping is a bug.

    MemfitError
    ├── UsageError            bad command-line usage (exit 2)
    ├── InvalidSetupError     a training setup or number that cannot be right (collects every problem)
    ├── UnknownModelError     a model name that is in no catalog, cache or path (with close matches)
    ├── UnknownHardwareError  a GPU / Mac name that is not in the hardware catalog (with close matches)
    ├── SourceError           a config.json, model directory, safetensors header or Hub answer that cannot be read
    └── MissingExtraError     an optional dependency is missing (names the pip install that brings it)
"""

from __future__ import annotations


class MemfitError(Exception):
    """Base of every error memfit reports to a user."""

    exit_code = 1


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
        return "; ".join(p.render(namer) if isinstance(p, Problem) else p for p in self.problems)


class UnknownModelError(MemfitError):
    pass


class UnknownHardwareError(MemfitError):
    pass


class SourceError(MemfitError):
    pass


class MissingExtraError(MemfitError):
    pass


def did_you_mean(name: str, choices: list[str], listing_command: str) -> str:
    """A ' (did you mean ...?)' hint plus the command that lists every choice."""
    import difflib

    close = difflib.get_close_matches(name.lower(), choices, n=3, cutoff=0.6)
    if not close:
        # Substring matches catch "llama-8b" -> "llama-3.1-8b" that difflib misses.
        key = name.lower().replace("_", "-")
        close = [c for c in choices if key in c][:3]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"{hint} (`{listing_command}` lists them)"
