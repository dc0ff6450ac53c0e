"""One setup, one answer (issue #13): the Python API, the command line and POST /api/estimate give byte-identical
JSON for the same request, because all three build a Request and call report()."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memfit
from memfit.cli import main
from memfit.options import BY_NAME, SETUP_OPTIONS, flag_words

starlette = pytest.importorskip("starlette.testclient")

MODELS = ["meta-llama/Llama-3.2-1B", "qwen2.5-0.5b", "Qwen/Qwen2.5-7B", "google/gemma-2-2b", "microsoft/phi-2",
          "mistralai/Mistral-7B-v0.1", "gpt2"]
HARDWARE = [{}, {"gpu": "rtx-4090"}, {"gpu": "a100-80gb"}, {"memory": "16GiB"}, {"mac": "36GB"},
            {"gpu": "rtx-3060"}]


def _value(option):
    if option.kind == "bool":
        return st.booleans()
    if option.kind == "choice":
        return st.sampled_from(option.choices)
    if option.kind == "targets":
        return st.sampled_from([("q", "v"), ("q", "k", "v", "o"), ("q", "k", "v", "o", "gate", "up", "down")])
    if option.kind == "text":          # a VLM's --image-size (refused on the text models sampled here)
        return st.sampled_from(["640x480", "1920x1080"])
    if option.name == "seq_len":
        return st.sampled_from([128, 512, 1000, 2048, 4096, 8192])
    if option.name == "lora_dropout":
        return st.sampled_from([0.0, 0.05, 0.1])
    if option.name in ("gpus", "nodes"):
        return st.sampled_from([1, 2, 4])
    if option.kind == "text":
        return st.sampled_from(["llama-3.2-1b", "qwen2.5-0.5b"])      # GKD's teacher
    if option.name == "vllm_gpu_util":
        return st.sampled_from([0.2, 0.5])
    if option.name == "lora_rank":
        return st.sampled_from([4, 8, 16, 64])
    return st.integers(min_value=1, max_value=8)


# A request sets a few options (the rest are the recipe's), as people do.
requests = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS),
    "hardware": st.sampled_from(HARDWARE),
    "options": st.lists(st.sampled_from([o.name for o in SETUP_OPTIONS]), max_size=5, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: _value(BY_NAME[n]) for n in names})),
})


@pytest.fixture(scope="module")
def client():
    from memfit.server import create_app

    return starlette.TestClient(create_app("127.0.0.1"))


def _python(model, hardware, options) -> tuple[int, str]:
    try:
        return 0, memfit.to_json(memfit.report(memfit.Request(model=model, setup=options, **hardware)))
    except memfit.MemfitError as exc:
        return 1, exc.render(lambda n: n) if hasattr(exc, "render") else str(exc)


def _cli(capsys, model, hardware, options) -> tuple[int, str]:
    argv = ["estimate", model, "--format", "json"]
    for name, value in {**options, **hardware}.items():
        argv += flag_words(name, value) if name in BY_NAME and BY_NAME[name].group == "setup" else \
            ["--" + name.replace("_", "-"), value]
    argv = [a.strip("'") for a in argv]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out.rstrip("\n") if code == 0 else err


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests)
def test_python_cli_and_api_give_the_same_bytes(capsys, client, req):
    model, hardware, options = req["model"], req["hardware"], req["options"]
    code, python = _python(model, hardware, options)
    cli_code, cli = _cli(capsys, model, hardware, options)
    body = {"model": model, **hardware, **{k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}}
    response = client.post("/api/estimate", json=body)
    assert cli_code == code, (cli, python)
    if code == 0:
        assert response.status_code == 200, response.text
        assert cli == python == response.text
        data = json.loads(python)
        implied = {"recipe"} if "mac" in hardware else set()     # a Mac means mlx-lm unless a recipe is given
        assert set(data["setup"]["explicit"]) == set(options) | implied
    else:
        assert response.status_code == 422, response.text
        # The same problem, each face in its own words (flags on the command line, JSON keys in the API).
        assert cli.startswith("error: ") and json.loads(response.text)["error"] == python


@settings(max_examples=200, deadline=None)
@given(requests)
def test_every_component_an_estimate_names_is_in_the_components_table(req):
    # components.py is the one list of names: the README's table, the trace's groups and the tracker read it.
    from memfit.components import BY_NAME as COMPONENTS

    try:
        rep = memfit.report(memfit.Request(model=req["model"], setup=req["options"], **req["hardware"]))
    except memfit.MemfitError:
        return
    names = {c.name for c in rep.estimate.components}
    assert names <= set(COMPONENTS), names - set(COMPONENTS)
