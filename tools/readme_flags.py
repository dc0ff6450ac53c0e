"""Rewrite the README's generated blocks (the flag reference from the options table, "What is counted" from
components.py): python tools/readme_flags.py

tests/test_cli.py::test_readme_flag_reference_is_the_options_table fails when they differ."""

from pathlib import Path

from memfit.components import readme_table
from memfit.options import flag_reference
from memfit.physics.optimizers import readme_table as optimizer_table

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> None:
    text = README.read_text()
    for group in ("setup", "hardware"):
        marker = f"<!-- flags:{group} -->\n```\n"
        head, rest = text.split(marker, 1)
        _, tail = rest.split("\n```", 1)
        text = head + marker + flag_reference(group) + "\n```" + tail
    head, rest = text.split("<!-- components -->\n", 1)
    _, tail = rest.split("\n<!-- /components -->", 1)
    text = head + "<!-- components -->\n" + readme_table() + "\n<!-- /components -->" + tail
    head, rest = text.split("<!-- optimizers -->\n", 1)
    _, tail = rest.split("\n<!-- /optimizers -->", 1)
    text = head + "<!-- optimizers -->\n" + optimizer_table() + "\n<!-- /optimizers -->" + tail
    README.write_text(text)


if __name__ == "__main__":
    main()
