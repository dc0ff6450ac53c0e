"""Reading a trainer's config file into a mapping, with the line of each key, or one SourceError saying why not.

Any file can arrive here: binary, not UTF-8, empty, a YAML alias bomb, nesting deep enough to exhaust Python's
stack, duplicate keys (PyYAML and json keep the last one silently; the trainer would too, so the first value a
user reads is not the one that runs). Each is refused with the file's name and, for YAML, the line.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import SourceError

MAX_BYTES = 8 << 20       # a training config is a few KiB; past this it is not one
MAX_DEPTH = 64            # the deepest real config nests 4 or 5 levels
MAX_VALUES = 200_000      # values after YAML aliases are expanded (a "billion laughs" expands to 10**9)


def load_config(path: Path, lines: dict | None = None) -> dict:
    """The top-level mapping of a YAML or JSON config (JSON when the name ends in .json). `lines`, when given, is
    filled with {dotted key: 1-based line} for the keys of nested mappings (YAML only)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise SourceError(f"{path}: is a folder, not a config file")
        if not path.is_file():
            raise SourceError(f"{path}: no such config file")
        raw = path.read_bytes() if path.stat().st_size <= MAX_BYTES else None
    except OSError as exc:
        raise SourceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if raw is None:
        raise SourceError(f"{path}: larger than {MAX_BYTES >> 20} MiB, not a training config")
    if b"\x00" in raw:
        raise SourceError(f"{path}: a binary file, not a YAML or JSON config")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    if not text.strip():
        raise SourceError(f"{path}: the file is empty")
    if path.suffix.lower() == ".sh":
        from .swift import command_line   # a launch script: `swift sft|rlhf ... --key value`

        return command_line(text, str(path))
    data = _load_json(path, text) if path.suffix.lower() == ".json" else _load_yaml(path, text, lines)
    if data is None:
        raise SourceError(f"{path}: the file has no keys (empty, or only comments)")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single {type(data).__name__} value"
        raise SourceError(f"{path}: expected a mapping of keys at the top level, got {kind}")
    return data


# ---- JSON ---------------------------------------------------------------------------------------------------------
def _load_json(path: Path, text: str):
    def pairs(items):
        seen = {}
        for key, value in items:
            if key in seen:
                raise SourceError(f"{path}: key {key!r} appears twice in one object (the second would win)")
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise SourceError(f"{path}: nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as exc:      # an integer of more digits than Python converts
        raise SourceError(f"{path}: not valid JSON ({str(exc).split(';')[0]})") from None
    _check_depth(path, data)
    return data


def _check_depth(path: Path, data) -> None:
    stack = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SourceError(f"{path}: nested too deeply (more than {MAX_DEPTH} levels)")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)


# ---- YAML ---------------------------------------------------------------------------------------------------------
def _load_yaml(path: Path, text: str, lines: dict | None):
    import yaml

    loader = None
    try:
        loader = yaml.SafeLoader(text)     # its reader refuses control characters here already
        node = loader.get_single_node()
        if node is None:
            return None
        _Measure(path).walk(node, 0)
        _key_lines(path, node, "", lines if lines is not None else {}, set())
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        if isinstance(exc, yaml.reader.ReaderError):     # a control character: say which, and where
            where = f":{text.count(chr(10), 0, exc.position) + 1}"
            char = chr(exc.character) if isinstance(exc.character, int) else exc.character
            problem = f"the control character {char!r} is not allowed"
        else:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SourceError(f"{path}{where}: not valid YAML ({problem})") from None
    except RecursionError:
        raise SourceError(f"{path}: nested too deeply (more than {MAX_DEPTH} levels)") from None
    except (ValueError, TypeError, OverflowError) as exc:
        # The safe constructor turns a bad timestamp (2024-13-45) or a 5,000-digit integer into a bare ValueError.
        raise SourceError(f"{path}: a value cannot be read as YAML ({str(exc).split(';')[0]})") from None
    finally:
        if loader is not None:
            loader.dispose()


class _Measure:
    """Depth and size of a composed YAML node graph, counting each alias as the copy it stands for (memoised,
    so a bomb is measured without being expanded); a node that contains itself is refused."""

    def __init__(self, path: Path):
        self.path, self.memo, self.open = path, {}, set()

    def walk(self, node, depth: int) -> int:
        from yaml.nodes import MappingNode, SequenceNode

        key = id(node)
        if key in self.memo:
            size, height = self.memo[key]
            if depth + height > MAX_DEPTH:
                self._too_deep()
            return size
        if depth > MAX_DEPTH:
            self._too_deep()
        if key in self.open:
            raise SourceError(f"{self.path}:{node.start_mark.line + 1}: a YAML alias refers to the value that "
                              f"contains it")
        self.open.add(key)
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        size, height = 1, 0
        for child in children:
            size += self.walk(child, depth + 1)
            height = max(height, self.memo[id(child)][1] + 1)
            if size > MAX_VALUES:
                raise SourceError(f"{self.path}: YAML aliases expand to more than {MAX_VALUES:,} values "
                                  f"(an alias bomb?)")
        self.open.discard(key)
        self.memo[key] = (size, height)
        return size

    def _too_deep(self):
        raise SourceError(f"{self.path}: nested too deeply (more than {MAX_DEPTH} levels)")


def _key_lines(path: Path, node, prefix: str, lines: dict, visited: set) -> None:
    """Record each mapping key's line under its dotted path; refuse a key written twice in one mapping. A mapping
    reached again through an alias is not walked again (its keys keep the lines of their first path)."""
    from yaml.nodes import MappingNode, ScalarNode

    if not isinstance(node, MappingNode) or id(node) in visited:
        return
    visited.add(id(node))
    seen: dict = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        line = key_node.start_mark.line + 1
        name = key_node.value
        if (key_node.tag, name) in seen:
            raise SourceError(f"{path}:{line}: key {name!r} appears twice in one mapping (first on line "
                              f"{seen[(key_node.tag, name)]}; the second would win)")
        seen[(key_node.tag, name)] = line
        dotted = f"{prefix}{name}"
        lines.setdefault(dotted, line)
        _key_lines(path, value_node, dotted + ".", lines, visited)
