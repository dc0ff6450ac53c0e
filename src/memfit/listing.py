"""`memfit models`, `memfit gpus`, `memfit rule`: the catalogs and the rule-of-thumb table."""

from __future__ import annotations

from .errors import UnknownModelError, did_you_mean
from .estimator import SCHEMA_VERSION
from .render.jsonout import dumps
from .units import GB, count, gib


def render_models(family: str | None, fmt: str) -> str:
    from .sources.catalog import catalog_entries, family_members

    entries = list(catalog_entries()) if family is None else family_members(family)
    if not entries:
        families = sorted({e["family"] for e in catalog_entries()})
        raise UnknownModelError(f"no catalog family {family!r}" + did_you_mean(family, families, "memfit models"))
    from .sources.catalog import spec_from_entry

    rows = [_model_row(e, spec_from_entry(e)) for e in entries]
    rows.sort(key=lambda r: (r["family"], r["params"]))
    if fmt == "json":
        return dumps({"schema_version": SCHEMA_VERSION, "models": rows})
    lines = [f"{'slug':<30} {'params':>8}  {'family':<10} id"]
    lines += [f"{r['slug']:<30} {count(r['params']):>8}  {r['family']:<10} {r['id']}" for r in rows]
    lines.append(f"{len(rows)} models. Any other Hugging Face id, a config.json or a model directory works too.")
    return "\n".join(lines)


def _model_row(entry: dict, spec) -> dict:
    """The facts that decide memory, as memfit reads them, with their source."""
    return {"slug": entry["slug"], "id": entry["id"], "family": entry["family"], "params": entry["params"],
            "model_type": spec.model_type, "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size, "num_layers": spec.num_layers,
            "num_heads": spec.num_heads, "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size, "tied_embeddings": spec.tied_embeddings,
            "biases": {"qkv": spec.qkv_bias, "o": spec.o_bias, "mlp": spec.mlp_bias},
            "mlp": f"{spec.mlp_kind} ({spec.activation})", "norm": spec.norm_kind,
            "experts": {"total": spec.num_experts, "per_token": spec.experts_per_token} if spec.is_moe else None,
            "checkpoint_dtype": spec.checkpoint_dtype, "source": entry["source"]}


def render_gpus(fmt: str) -> str:
    from .hardware import MAC_SOURCES, MAC_WORKING_SET_SHARE, gpu_catalog, mac_share_words

    gpus = sorted(gpu_catalog(), key=lambda g: (g["vendor"], g["memory_bytes"]))
    macs = [{"ram_up_to_bytes": limit, "usable_share": share} for limit, share in MAC_WORKING_SET_SHARE]
    if fmt == "json":
        return dumps({"schema_version": SCHEMA_VERSION, "gpus": gpus, "mac_usable_share": macs, "mac_sources": MAC_SOURCES})
    lines = [f"{'slug':<18} {'memory':>11}  name"]
    lines += [f"{g['slug']:<18} {gib(g['memory_bytes']):>11}  {g['name']}"
              + (f"  (also: {', '.join(g['aliases'])})" if g["aliases"] else "") for g in gpus]
    lines.append("")
    lines.append("Apple silicon (--mac RAM or a model from `memfit macs`): usable = Metal's working-set limit,")
    lines.append(f"{mac_share_words()}; override with --mac-wired-limit. Any card: --memory 24GiB.")
    return "\n".join(lines)


def render_rule(fmt: str) -> str:
    from .rule import RULE_TABLE_SIZES_B, RULES

    rows = []
    for size in RULE_TABLE_SIZES_B:
        params = size * 1e9
        row = {"params_b": size}
        for key, (per_param, overhead, _) in RULES.items():
            row[key + "_gb"] = round((per_param * params + overhead) / GB, 1)
        rows.append(row)
    if fmt == "json":
        return dumps({"schema_version": SCHEMA_VERSION, "unit": "GB (1e9 bytes)", "rows": rows,
                      "rules": {k: {"gb_per_billion": v[0], "overhead_gb": v[1] / GB, "what": v[2]}
                                for k, v in RULES.items()}})
    lines = ["Rule of thumb (GB = 1e9 bytes; activations only as a flat allowance):",
             f"{'size':>6} {'QLoRA':>7} {'LoRA':>7} {'full':>7} {'full+master':>12}"]
    for r in rows:
        lines.append(f"{r['params_b']:>5g}B {r['qlora_gb']:>6.1f}  {r['lora_gb']:>6.0f}  {r['full_gb']:>6.0f}  "
                     f"{r['full-master_gb']:>11.0f}")
    lines += [f"{key}: {per_b:g} GB/B + {flat / GB:g} GB ({what})" for key, (per_b, flat, what) in RULES.items()]
    return "\n".join(lines)


def render_macs(fmt: str) -> str:
    from .hardware import mac_share_words
    from .macs import mac_catalog

    macs = mac_catalog()
    if fmt == "json":
        return dumps({"schema_version": SCHEMA_VERSION, "macs": [
            {"slug": m.slug, "chip": m.chip, "ram_bytes": m.ram_bytes, "working_set_bytes": m.working_set_bytes,
             "working_set_kind": m.working_set_kind, "working_set_source": m.working_set_source,
             "machines": m.machines, "ram_source": m.ram_source} for m in macs]})
    lines = [f"{'slug':<22} {'RAM':>7} {'usable':>11}  how usable is known"]
    lines += [f"{m.slug:<22} {m.ram_bytes // 2**30:>4} GB {gib(m.working_set_bytes):>11}  {m.working_set_kind}"
              for m in macs]
    lines.append("usable = Metal's recommendedMaxWorkingSetSize ('measured': a published log line; 'rule': "
                 f"{mac_share_words()}). Use --mac SLUG, or --mac 36GB for any Mac.")
    return "\n".join(lines)
