"""Rewrite the README's flag reference blocks from the options table, and its PEFT method table from
physics/adapters.py: python tools/readme_flags.py

tests/test_cli.py::test_readme_flag_reference_is_the_options_table fails when they differ."""

from pathlib import Path

from memfit.options import flag_reference
from memfit.physics.adapters import method_table

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> None:
    text = README.read_text()
    for group in ("setup", "hardware"):
        marker = f"<!-- flags:{group} -->\n```\n"
        head, rest = text.split(marker, 1)
        _, tail = rest.split("\n```", 1)
        text = head + marker + flag_reference(group) + "\n```" + tail
    marker = "<!-- methods -->\n"
    head, rest = text.split(marker, 1)
    _, tail = rest.split("<!-- /methods -->", 1)
    text = head + marker + method_table() + "\n<!-- /methods -->" + tail
    README.write_text(text)


if __name__ == "__main__":
    main()
