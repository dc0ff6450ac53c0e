"""The dataset check on small files of every layout, with a tokenizer trained here (one token per word)."""

import csv
import json
from pathlib import Path

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


# ---- hardening: every bad dataset is one SourceError naming the file and the example -------------------------
def _bad(tmp_path, tokenizer, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SourceError) as info:
        token_lengths(str(path), tokenizer)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


@pytest.mark.parametrize("name", ["data.jsonl", "data.json", "data.csv"])
def test_binary_files(tmp_path, tokenizer, name):
    assert "not UTF-8" in _bad(tmp_path, tokenizer, name, b"\x89PNG\r\n\x1a\n" + bytes(range(256)))


def test_binary_parquet(tmp_path, tokenizer):
    pytest.importorskip("pyarrow")
    assert "not a readable Parquet file" in _bad(tmp_path, tokenizer, "data.parquet", b"PAR1" + bytes(range(256)))


def test_truncated_parquet(tmp_path, tokenizer):
    pytest.importorskip("pyarrow")
    good = Path(_write(tmp_path, "text", "parquet")).read_bytes()
    assert "not a readable Parquet file" in _bad(tmp_path, tokenizer, "cut.parquet", good[: len(good) // 2])


def test_latin1_names_the_line(tmp_path, tokenizer):
    content = '{"text": "caf\u00e9"}\n'.encode() + '{"text": "caf\u00e9"}\n'.encode("latin-1")
    assert "data.jsonl:2: not UTF-8" in _bad(tmp_path, tokenizer, "data.jsonl", content)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32"])
def test_utf16_and_utf32_are_named(tmp_path, tokenizer, encoding):
    message = _bad(tmp_path, tokenizer, "data.jsonl", '{"text": "w1"}\n'.encode(encoding))
    assert f"{encoding.upper()} text; save it as UTF-8" in message


def test_utf8_bom_is_accepted(tmp_path, tokenizer):
    for name, text in (("a.jsonl", '{"text": "w1 w2"}\n'), ("a.csv", "text\nw1 w2\n"), ("a.json", '[{"text": "w1 w2"}]')):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert token_lengths(str(path), tokenizer)[0] == [2]


@pytest.mark.parametrize("line,match", [("[1, 2]", "data.jsonl:2: expected one JSON object per line, got a JSON list"),
                                        ("42", "data.jsonl:2: expected one JSON object per line, got a JSON number"),
                                        ('"text"', "got a JSON string"),
                                        ('{"text": 5}', "data.jsonl:2: 'text' must be text, got number 5"),
                                        ('{"text": null}', "data.jsonl:2: 'text' must be text, got null"),
                                        ('{"text": "\\ud800"}', "unpaired UTF-16 surrogate"),
                                        ('{"other": "w1"}', "data.jsonl:2: no 'text' field"),
                                        ("[" * 50_000, "data.jsonl:2: JSON nested too deeply")])
def test_malformed_jsonl_rows(tmp_path, tokenizer, line, match):
    import re

    assert re.search(match, _bad(tmp_path, tokenizer, "data.jsonl", '{"text": "w1"}\n' + line + "\n"))


@pytest.mark.parametrize("record,match", [
    ({"messages": "hello"}, "'messages' must be a non-empty list"),
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"messages": ["hello"]}, r"messages\[0\] must be an object"),
    ({"messages": [{"role": "user", "content": {"a": 1}}]}, r"messages\[0\].content' must be text"),
    ({"messages": [{"role": 3, "content": "w1"}]}, r"messages\[0\].role' must be text"),
    ({"prompt": "w1", "completion": ["w2"]}, "'completion' must be text, got list"),
    ({"instruction": "w1", "input": 7, "output": "w2"}, "'input' must be text"),
])
def test_malformed_rows_in_json(tmp_path, tokenizer, record, match):
    import re

    message = _bad(tmp_path, tokenizer, "data.json", json.dumps([record]))
    assert "item 0" in message and re.search(match, message)


def test_missing_fields_after_the_first_row(tmp_path, tokenizer):
    rows = [{"prompt": "w1", "completion": "w2"}, {"prompt": "w3"}]
    message = _bad(tmp_path, tokenizer, "data.json", json.dumps(rows))
    assert "item 1: no 'completion' field (the dataset's layout is prompt-completion" in message


def test_multimodal_content_parts_are_counted(tmp_path, tokenizer):
    path = tmp_path / "parts.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "w1 w2"},
                                                                          {"type": "image"}]}]}))
    assert token_lengths(str(path), tokenizer)[0] == [3]   # "user:" + two words


def test_csv_field_over_128kb_is_read(tmp_path, tokenizer):
    path = tmp_path / "long.csv"
    path.write_text("text\n" + " ".join(["w1"] * 100_000) + "\n")     # 300 KB in one field
    assert token_lengths(str(path), tokenizer)[0] == [100_000]


@pytest.mark.parametrize("content,match", [("text\n\"w1\"w2\n", r"long.csv:2: not valid CSV"),
                                           ("text\n\"w1 w2\n", r"long.csv:\d+: not valid CSV.*unexpected end of data"),
                                           ("text\nw1,w2\n", "long.csv:2: 1 more field"),
                                           ("text\n", "no examples"),
                                           ("prompt,completion\nw1\n", "long.csv:2: 'completion' must be text, got null")])
def test_malformed_csv(tmp_path, tokenizer, content, match):
    import re

    assert re.search(match, _bad(tmp_path, tokenizer, "long.csv", content))


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.json", "empty.csv", "empty.parquet"])
def test_empty_files(tmp_path, tokenizer, name):
    assert "empty file" in _bad(tmp_path, tokenizer, name, b"")


def test_blank_jsonl_has_no_examples(tmp_path, tokenizer):
    assert "no examples" in _bad(tmp_path, tokenizer, "blank.jsonl", "\n\n  \n")


def test_cli_bad_dataset_is_one_error_line(tmp_path, tokenizer, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "w1"}\n[1]\n')
    assert main(["estimate", "llama-3.2-1b", "--dataset", str(path), "--tokenizer", tokenizer]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: {path}:2: expected one JSON object")
