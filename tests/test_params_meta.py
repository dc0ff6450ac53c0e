"""Exact parameter counts: the catalog's count and memfit's formula both equal numel() of the real model.

transformers is the oracle: each catalog family is built from its config on the meta device (no memory, no
weights) and its parameters counted. Skipped without torch/transformers (pip install '.[trace]').
"""

import pytest

from memfit.params import count_params
from memfit.sources.catalog import catalog_entries, spec_from_entry

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _meta_numel(config_dict):
    config = transformers.AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    # parameters() yields a tied weight once, as the optimizer sees it.
    return sum(p.numel() for p in model.parameters())


# One representative per family keeps this under a minute; the formula is the same for a family's sizes.
def _one_per_family():
    seen, out = set(), []
    for entry in catalog_entries():
        key = entry["config"]["model_type"] + str(entry["config"].get("tie_word_embeddings"))
        if entry["family"] in seen and key in seen:
            continue
        seen.update({entry["family"], key})
        out.append(entry)
    return out


@pytest.mark.parametrize("entry", _one_per_family(), ids=lambda e: e["slug"])
def test_catalog_count_equals_meta_numel(entry):
    spec = spec_from_entry(entry)
    numel = _meta_numel(entry["config"])
    assert count_params(spec).total == numel
    assert entry["params"] == numel
