"""The dataset check on small files of every layout, with a tokenizer trained here (one token per word)."""

import csv
import json

import pytest

tokenizers = pytest.importorskip("tokenizers")

from memfit.cli import main  # noqa: E402
from memfit.dataset import length_stats, length_warnings, suggested_length, token_lengths  # noqa: E402
from memfit.errors import SourceError  # noqa: E402

WORDS = [f"w{i}" for i in range(50)]
# 100 examples: lengths 1..100 words, so every percentile is known exactly.
LENGTHS = list(range(1, 101))


def _text(n):
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


@pytest.fixture
def tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _write(tmp_path, layout, fmt):
    records = []
    for n in LENGTHS:
        if layout == "text":
            records.append({"text": _text(n)})
        elif layout == "prompt-completion":
            records.append({"prompt": _text(n // 2) + " ", "completion": _text(n - n // 2)})
        elif layout == "instruction-output":
            records.append({"instruction": _text(n // 2), "input": "", "output": _text(n - n // 2)})
        else:
            records.append({"messages": [{"role": "user", "content": _text(n // 2)},
                                         {"role": "assistant", "content": _text(n - n // 2)}]})
    path = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in records))
    elif fmt == "json":
        path.write_text(json.dumps(records))
    elif fmt == "csv":
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    return str(path)


@pytest.mark.parametrize("layout,fmt", [("text", "jsonl"), ("prompt-completion", "json"),
                                        ("instruction-output", "csv"), ("text", "parquet"), ("chat", "jsonl"),
                                        ("chat", "parquet")])
def test_lengths_of_every_layout(tmp_path, tokenizer, layout, fmt):
    lengths, found = token_lengths(_write(tmp_path, layout, fmt), tokenizer)
    assert found == layout
    # chat without a template joins "role: content" lines: two role words per example
    extra = 2 if layout == "chat" else 0
    assert sorted(lengths) == [n + extra for n in LENGTHS]
    stats = length_stats(lengths, found, seq_len=50 + extra)
    assert (stats.p50, stats.p90, stats.p99, stats.max) == tuple(v + extra for v in (50, 90, 99, 100))
    assert stats.truncated_share == 0.5
    assert sum(n for _, _, n in stats.histogram) == 100


def test_warnings_and_suggested_length(tmp_path, tokenizer):
    lengths, layout = token_lengths(_write(tmp_path, "text", "jsonl"), tokenizer)
    below = length_stats(lengths, layout, seq_len=32)
    assert [w["code"] for w in length_warnings(below)] == ["length-below-typical"]
    assert "68%" in length_warnings(below)[0]["message"]
    assert suggested_length(length_stats(lengths, layout, None)) == 128     # p99 = 99 -> next multiple of 64
    assert length_warnings(length_stats(lengths, layout, seq_len=128)) == []


def test_estimate_with_a_dataset_picks_the_length_and_reports_it(capsys, tmp_path, tokenizer):
    data = _write(tmp_path, "text", "jsonl")
    assert main(["estimate", "llama-3.2-1b", "--dataset", data, "--tokenizer", tokenizer, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["seq_len"] == 128 and out["dataset"]["p99"] == 99
    assert main(["estimate", "llama-3.2-1b", "--dataset", data, "--tokenizer", tokenizer, "--seq-len", "32",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "length-below-typical" in [w["code"] for w in out["warnings"]]


def test_bad_dataset_files(tmp_path, tokenizer):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{oops\n')
    with pytest.raises(SourceError, match="bad.jsonl:2"):
        token_lengths(str(bad), tokenizer)
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"question": "a"}\n')
    with pytest.raises(SourceError, match="layout"):
        token_lengths(str(odd), tokenizer)
    with pytest.raises(SourceError, match="unknown dataset format"):
        token_lengths(str(tmp_path / "x.txt"), tokenizer) if (tmp_path / "x.txt").write_text("a") else None


def test_chat_template_from_a_model_directory(tmp_path, tokenizer):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(tokenizer), unk_token="[UNK]")
    fast.chat_template = "{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}"
    model_dir = tmp_path / "model"
    fast.save_pretrained(str(model_dir))
    lengths, layout = token_lengths(_write(tmp_path, "chat", "jsonl"), str(model_dir))
    # each role marker is one (unknown) word: two per example, as with the plain join, but now from the template
    assert layout == "chat" and sorted(lengths) == [n + 2 for n in LENGTHS]
