"""Rewrite the README's generated blocks: the flag reference from the options table, "What is counted" from
components.py, and the PEFT method table from physics/adapters.py: python tools/readme_flags.py

tests/test_cli.py::test_readme_flag_reference_is_the_options_table fails when they differ."""

from pathlib import Path

from memfit.components import readme_table
from memfit.options import flag_reference
from memfit.physics.adapters import method_table
from memfit.physics.optimizers import readme_table as optimizer_table

README = Path(__file__).resolve().parent.parent / "README.md"


def _replace(text: str, start: str, end: str, body: str) -> str:
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + start + body + end + tail


def main() -> None:
    text = README.read_text()
    for group in ("setup", "hardware"):
        text = _replace(text, f"<!-- flags:{group} -->\n```\n", "\n```", flag_reference(group))
    text = _replace(text, "<!-- components -->\n", "\n<!-- /components -->", readme_table())
    text = _replace(text, "<!-- methods -->\n", "\n<!-- /methods -->", method_table())
    text = _replace(text, "<!-- optimizers -->\n", "\n<!-- /optimizers -->", optimizer_table())
    README.write_text(text)


if __name__ == "__main__":
    main()
