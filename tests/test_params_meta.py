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


@pytest.mark.parametrize("entry", catalog_entries(), ids=lambda e: e["slug"])
def test_catalog_count_equals_meta_numel(entry):
    spec = spec_from_entry(entry)
    numel = _meta_numel(entry["config"])
    assert count_params(spec).total == numel
    assert entry["params"] == numel


@pytest.mark.parametrize("model_type", sorted(__import__("memfit.spec", fromlist=["x"]).FAMILY_TRAITS))
def test_family_layer_class_is_the_one_transformers_keeps_whole(model_type):
    # FSDP wraps (engine_config) and the trace's layer boundary use FAMILY_TRAITS' layer class; transformers
    # names the same class in _no_split_modules (the unit it never splits across devices).
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from memfit.spec import FAMILY_TRAITS

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    assert FAMILY_TRAITS[model_type]["layer"] in model_class._no_split_modules
