"""The built-in model catalog: one JSON file per model under memfit/data/models.

Each file holds the model's Hub id, a short slug, aliases, its family, the config.json keys that matter for
memory (copied from the model's config.json on the Hub, cited in ``source``) and ``params``, the count
transformers builds (checked against numel() on the meta device by tests/test_params_meta.py).
Adding a model is adding a file. Nothing is read until first use.
"""

from __future__ import annotations

import json
from functools import lru_cache
from ..data import DATA_DIR

from ..errors import UnknownModelError, did_you_mean
from ..spec import ModelSpec


@lru_cache(maxsize=1)
def catalog_entries() -> tuple[dict, ...]:
    folder = DATA_DIR / "models"
    entries = []
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            entries.append(json.loads(item.read_text(encoding="utf-8")))
    return tuple(entries)


@lru_cache(maxsize=1)
def _index() -> dict[str, dict]:
    index: dict[str, dict] = {}
    for entry in catalog_entries():
        names = [entry["id"], entry["slug"], *entry.get("aliases", [])]
        for name in names:
            index[_key(name)] = entry
    return index


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def find_entry(name: str) -> dict | None:
    """Exact lookup by Hub id, slug or alias, case-insensitively; also accepts an id without its org."""
    index = _index()
    key = _key(name)
    if key in index:
        return index[key]
    if "/" not in key:
        for entry in catalog_entries():
            if _key(entry["id"].split("/", 1)[1]) == key:
                return entry
    return None


def spec_from_entry(entry: dict) -> ModelSpec:
    return ModelSpec.from_hf_config(entry["config"], name=entry["id"], source=f"catalog:{entry['slug']}",
                                    family=entry["family"], processor=entry.get("processor"))


def load_catalog_model(name: str) -> ModelSpec:
    entry = find_entry(name)
    if entry is None:
        raise UnknownModelError(f"unknown model {name!r}" + did_you_mean(name, slugs(), "memfit models"))
    return spec_from_entry(entry)


def slugs() -> list[str]:
    return [entry["slug"] for entry in catalog_entries()]


def family_members(family: str) -> list[dict]:
    """Catalog entries of a family ("qwen2.5") or of every family that starts with it ("qwen", "llama-3")."""
    key = _key(family)
    exact = [e for e in catalog_entries() if e["family"] == key]
    return exact or [e for e in catalog_entries() if e["family"].startswith(key)]
