import json

import pytest
import torch
from conftest import make_tiny_llama, make_tokenizer, write_jsonl

from tunelab.cli import main
from tunelab.commands.eval import read_rows
from tunelab.data.examples import IGNORE
from tunelab.data.formats import TEMPLATES, prompt_text
from tunelab.data.pipeline import DataSpec, prepare
from tunelab.errors import TunelabError
from tunelab.eval.exact_match import extract, parse_answer, score
from tunelab.eval.generate import BUDGET_SLACK, Stops, evaluate, generate, prompt_ids, stops
from tunelab.eval.sampling import Samples
from tunelab.eval.setup import Setup, resolve_setup


@pytest.mark.parametrize(
    "answer, parsed",
    [("4898", (4898,)), ("-73", (-73,)), (4898, (4898,)), ("62 R 47", (62, 47)), ("0 R 3", (0, 3)), ("04898", (4898,))],
)
def test_parse_answer(answer, parsed):
    assert parse_answer(answer) == parsed


@pytest.mark.parametrize("answer", ["", "forty", "4.5", "62 R", "1 R 2 R 3", None])
def test_parse_answer_rejects(answer):
    assert parse_answer(answer) is None


@pytest.mark.parametrize(
    "response, expected",
    [
        ("4821 + 77 = 4898", (4898,)),  # the restated operands come first; the result is last
        ("4821 - 9000 = -4179", (-4179,)),
        ("The answer is 4,898.", (4898,)),
        ("12-5", (5,)),  # a '-' right after a digit is an operator, not a sign
        ("x-3 and then 7", (7,)),
        ("no digits here", None),
        ("", None),
        ("397 * 4429 = 4429 * (300 + 90 + 7) = 1727310 + 31003 = 1758313", (1758313,)),
    ],
)
def test_extract_last_integer(response, expected):
    assert extract(response, 1) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("4821 / 77 = 62 R 47", (62, 47)),
        ("4821 / 77 = 62R47", (62, 47)),
        ("4821 / 77 = 62", None),  # no remainder written: not a division answer
        ("1 R 2, no: 3 R 4", (3, 4)),
    ],
)
def test_extract_quotient_remainder(response, expected):
    assert extract(response, 2) == expected


def test_score_overall_and_breakdowns():
    rows = [
        {"answer": "4898", "op": "add", "digits_a": 4, "digits_b": 2},
        {"answer": "4898", "op": "add", "digits_a": 4, "digits_b": 2},
        {"answer": "-5", "op": "sub", "digits_a": 1, "digits_b": 2},
        {"answer": "62 R 47", "op": "div", "digits_a": 4, "digits_b": 2},
        {"answer": "62 R 47", "op": "div", "digits_a": 4, "digits_b": 2},
        {"answer": "7"},  # a foreign row: counted overall only
    ]
    responses = ["4821 + 77 = 4898", "4821 + 77 = 4899", "5 - 10 = -5", "= 62 R 47", "= 62 R 46", "7"]
    result = score(rows, responses, seconds=2.0)
    assert (result.n, result.correct) == (6, 4)
    assert result.accuracy == pytest.approx(4 / 6)
    assert {op: (b.n, b.correct) for op, b in result.by_op.items()} == {"add": (2, 1), "div": (2, 1), "sub": (1, 1)}
    assert {d: (b.n, b.correct) for d, b in result.by_digits.items()} == {2: (1, 1), 4: (4, 2)}
    assert [p.correct for p in result.predictions] == [True, False, True, True, False, True]
    assert result.predictions[4].predicted == "62 R 46"
    summary = result.summary()
    assert summary["accuracy"] == pytest.approx(4 / 6) and summary["rows_per_s"] == 3.0
    assert summary["by_digits"]["4"] == {"n": 4, "correct": 2, "accuracy": 0.5}
    json.dumps(summary)  # one JSON line for --json


def test_read_rows_limit_and_blank_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(
            json.dumps({"instruction": f"{i} + 1", "output": f"{i} + 1 = {i + 1}", "answer": str(i + 1)}) + "\n\n"
            for i in range(5)
        )
    )
    assert [r["answer"] for r in read_rows(path, "alpaca", None)] == ["1", "2", "3", "4", "5"]
    assert len(read_rows(path, "alpaca", 2)) == 2


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"instruction": "1 + 1", "output": "1 + 1 = 2", "answer": "2"}', "{not json"],
            "rows.jsonl:2: not valid JSON",
        ),
        (['{"instruction": "1 + 1", "output": "1 + 1 = 2"}'], "rows.jsonl:1: no 'answer' field"),
        (['{"instruction": "1 + 1", "output": "1 + 1 = 2", "answer": "two"}'], "rows.jsonl:1: answer 'two'"),
        (['{"output": "1 + 1 = 2", "answer": "2"}'], "rows.jsonl:1: missing field 'instruction'"),
        (["[1, 2]"], "rows.jsonl:1: each line must be a JSON object"),
        ([""], "no rows to evaluate"),
    ],
)
def test_read_rows_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TunelabError, match=message):
        read_rows(path, "alpaca", None)


def test_eval_cli_bad_data_is_one_line_before_loading_a_model(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"instruction": "1 + 1", "output": "1 + 1 = 2"}\n')
    assert main(["eval", "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rows.jsonl:1: no 'answer' field" in err and err.count("\n") == 1
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["eval", "--data", str(path), "--batch-size", "0"]) == 2


def test_setup_from_the_run_config_with_overrides(tmp_path):
    from tunelab.config import TrainConfig, dump_yaml

    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text("{}")
    cfg = TrainConfig(model="some/model")
    cfg.data.format, cfg.data.template = "alpaca", "compact"
    (run / "config.yaml").write_text(dump_yaml(cfg))
    adapter = str(run / "adapter")
    assert resolve_setup(adapter, None, None, None) == Setup("some/model", "alpaca", "compact")
    assert resolve_setup(adapter, "embedded", None, "alpaca") == Setup("embedded", "alpaca", "alpaca")
    assert resolve_setup(None, None, None, None) == Setup("embedded", "alpaca", "alpaca")
    (run / "config.yaml").unlink()
    with pytest.raises(TunelabError, match="pass --model"):
        resolve_setup(adapter, None, None, None)
    with pytest.raises(TunelabError, match="not an adapter directory"):
        resolve_setup(str(run), None, None, None)


# --- generation and evaluate() on tiny models (conftest) ---


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("bos", [False, True])
def test_eval_prompt_tokens_are_exactly_the_training_prompt(tmp_path, addition_rows, template, bos):
    tok = make_tokenizer()
    tok.add_bos_token = bos
    path = write_jsonl(tmp_path / "rows.jsonl", addition_rows[:8])
    data = prepare(DataSpec(str(path), "alpaca", template, False, 512), tok)
    prompts = prompt_ids(tok, [prompt_text("alpaca", template, row) for row in addition_rows[:8]])
    for i, prompt in enumerate(prompts):
        ids, targets = (
            data.ids[data.offsets[i] : data.offsets[i + 1]],
            data.targets[data.offsets[i] : data.offsets[i + 1]],
        )
        first_learned = next(t for t, target in enumerate(targets) if target != IGNORE)
        assert prompt == ids[: first_learned + 1].tolist()  # everything before the first response token
        assert (prompt[0] == tok.bos_token_id) == bos


@pytest.mark.slow
def test_batched_left_padded_generation_equals_one_prompt_at_a_time(tokenizer):
    model = make_tiny_llama(len(tokenizer), seed=1, initializer_range=0.5).eval()
    texts = [f"{'9' * k} + {k}" for k in range(1, 12)]
    prompts = prompt_ids(tokenizer, texts)
    budgets = [6] * len(prompts)
    alone = [generate(model, tokenizer, [p], [6], batch_size=1).texts[0] for p in prompts]
    assert generate(model, tokenizer, prompts, budgets, batch_size=4).texts == alone
    assert len(set(alone)) > 1  # the check means something only if outputs differ


class AnsweringModel(torch.nn.Module):
    """Stands in for a model: answers each left-padded prompt's 'a + b' (wrong when a is odd), recording calls."""

    def __init__(self, tokenizer):
        super().__init__()
        self.tok = tokenizer
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.calls = []

    def sample(self, prompts, max_new_tokens, stop_ids, pad_id, temperature=1.0, **kwargs):
        """Stands in for eval/sampling.sample: the answer plus EOS per prompt, the call recorded."""
        assert temperature == 0  # eval decodes greedily
        self.calls.append((len(prompts), max_new_tokens, self.training))
        ids = []
        for prompt in prompts:
            instruction = self.tok.decode(prompt).split("### Instruction:\n")[1].split("\n")[0]
            a, b = (int(x) for x in instruction.split(" + "))
            answer = self.tok(f"{a} + {b} = {a + b + a % 2}", add_special_tokens=False)["input_ids"]
            ids.append((answer + [self.tok.eos_token_id])[:max_new_tokens])
        return Samples(ids, [self.tok.eos_token_id not in row for row in ids])


def test_evaluate_keeps_row_order_and_budgets_each_batch(tokenizer, addition_rows, monkeypatch):
    import tunelab.eval.generate as generate_module

    rows = [dict(r, op="add", digits_a=len(r["instruction"].split(" + ")[0]), digits_b=1) for r in addition_rows]
    model = AnsweringModel(tokenizer).train()
    monkeypatch.setattr(generate_module, "sample", lambda m, *a, **kw: m.sample(*a, **kw))
    result = evaluate(model, tokenizer, rows, "alpaca", "compact", batch_size=10)
    expected = [int(r["instruction"].split(" + ")[0]) % 2 == 0 for r in rows]
    assert [p.correct for p in result.predictions] == expected  # predictions line up with their rows
    assert result.correct == sum(expected) and result.n == len(rows) == 64
    assert [c[0] for c in model.calls] == [10] * 6 + [4]
    longest = max(len(tokenizer(r["output"] + tokenizer.eos_token)["input_ids"]) for r in rows)
    assert max(c[1] for c in model.calls) == longest + BUDGET_SLACK
    assert min(c[1] for c in model.calls) < longest + BUDGET_SLACK  # short batches stop earlier
    assert sum(b.n for b in result.by_digits.values()) == 64 and set(result.by_op) == {"add"}
    assert result.capped == 0
    fixed = evaluate(model, tokenizer, rows[:5], "alpaca", "compact", batch_size=10, max_new_tokens=3)
    assert model.calls[-1][1] == 3 and fixed.n == 5 and fixed.capped == 5  # every answer is longer: all cut
    trained = evaluate(model, tokenizer, rows[:5], "alpaca", "compact", batch_size=10, trained_response_tokens=20)
    assert model.calls[-1][1] == 20 + BUDGET_SLACK and trained.capped == 0


# --- where a response stops ---

LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def successor_model(tokenizer, successors: dict[str, str], default: str = "x"):
    """A tiny Llama whose greedy next token depends only on the current one: `successors[token]`, else `default`.

    Attention and MLP outputs are zeroed so the last hidden state is the current token's embedding; embeddings
    are orthonormal and each lm_head row is the sum of the embeddings of the tokens it follows."""
    vocab = len(tokenizer)
    model = make_tiny_llama(vocab, hidden_size=128, intermediate_size=128).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        torch.manual_seed(0)
        basis = torch.linalg.qr(torch.randn(128, 128))[0][:vocab] * 10
        model.model.embed_tokens.weight.copy_(basis)
        head = torch.zeros(vocab, 128)
        for token in range(vocab):
            text = tokenizer.convert_ids_to_tokens(token)
            head[tokenizer.convert_tokens_to_ids(successors.get(text, default))] += basis[token]
        model.lm_head.weight.copy_(head)
    return model


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_successor_model_runs_on_without_a_stop(tokenizer):
    model = successor_model(tokenizer, {"\n": "4", "4": "2", "2": "<|im_end|>"})
    out = model.generate(torch.tensor([ids_of(tokenizer, "1+1\n")]), do_sample=False, max_new_tokens=6, eos_token_id=[])
    assert tokenizer.convert_ids_to_tokens(out[0, 4:].tolist()) == ["4", "2", "<|im_end|>", "x", "x", "x"]


@pytest.mark.parametrize("fmt", ["chat", "sharegpt"])
def test_chat_generation_stops_at_chatml_end_of_turn_and_drops_it(tokenizer, fmt):
    """The tokenizer's EOS is `</s>`; the template's end of turn `<|im_end|>` still ends the response."""
    model = successor_model(tokenizer, {"\n": "4", "4": "2", "2": "<|im_end|>"})
    row = (
        {"messages": [{"role": "user", "content": "1+1"}], "answer": "42"}
        if fmt == "chat"
        else {"conversations": [{"from": "human", "value": "1+1"}], "answer": "42"}
    )
    result = evaluate(model, tokenizer, [row], fmt, "alpaca", max_new_tokens=8)
    assert result.predictions[0].response == "42"
    assert stops(model, tokenizer, fmt).ids == (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))


def test_chatml_fallback_for_a_tokenizer_without_a_template_stops_at_im_end():
    tok = make_tokenizer()
    tok.chat_template = None
    model = successor_model(tok, {"\n": "7", "7": "<|im_end|>"})
    row = {"messages": [{"role": "user", "content": "3+4"}], "answer": "7"}
    assert evaluate(model, tok, [row], "chat", "alpaca", max_new_tokens=8).predictions[0].response == "7"


def test_llama3_generation_stops_at_eot_id():
    tok = make_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    tok.chat_template = LLAMA3_TEMPLATE
    model = successor_model(tok, {"\n": "5", "5": "<|eot_id|>"})
    row = {"messages": [{"role": "user", "content": "2+3"}], "answer": "5"}
    assert evaluate(model, tok, [row], "chat", "alpaca", max_new_tokens=8).predictions[0].response == "5"
    assert tok.convert_tokens_to_ids("<|eot_id|>") in stops(model, tok, "chat").ids
    assert tok.convert_tokens_to_ids("<|im_end|>") not in stops(model, tok, "chat").ids  # not this template's


def test_end_of_turn_split_into_several_tokens_is_cut_from_the_text():
    """A tokenizer without the template's marker as a token learns it as plain characters: the text ends before it."""
    tok = make_tokenizer()  # no `<|eot_id|>` token
    tok.chat_template = LLAMA3_TEMPLATE
    assert stops(None, tok, "chat") == Stops((tok.eos_token_id,), ("<|eot_id|>",))
    model = successor_model(tok, {"\n": "6", "6": "E", "E": "N", "N": "D", "D": "7"}, default="7")
    stop = Stops((tok.eos_token_id,), ("END",))
    assert generate(model, tok, [ids_of(tok, "3+3\n")], [8], 1, stop).texts == ["6"]


def test_alpaca_stops_at_eos_and_at_every_generation_config_eos(tokenizer):
    model = successor_model(tokenizer, {"\n": "9", "9": "<|im_end|>", "<|im_end|>": "1", "1": "</s>"})
    prompt = ids_of(tokenizer, "9\n")
    # An alpaca prompt is not a chat turn: `<|im_end|>` is no stop, the tokenizer's EOS is.
    assert generate(model, tokenizer, [prompt], [8], 1, stops(model, tokenizer, "alpaca")).texts == ["91"]
    model.generation_config.eos_token_id = [2, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert generate(model, tokenizer, [prompt], [8], 1, stops(model, tokenizer, "alpaca")).texts == ["9"]
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("1")
    assert stops(model, tokenizer).ids == (2, tokenizer.convert_tokens_to_ids("1"))
    assert generate(model, tokenizer, [prompt], [8], 1).texts == ["9"]  # `<|im_end|>` is skipped as special text


def test_rows_of_one_batch_stop_independently(tokenizer):
    """One row stops after a token, the other after four; neither carries the other's padding or a marker."""
    chain = {"\n": "4", "4": "<|im_end|>", "=": "a", "a": "b", "b": "c", "c": "d", "d": "<|im_end|>"}
    model = successor_model(tokenizer, chain, default="z")
    prompts = [ids_of(tokenizer, "1+3\n"), ids_of(tokenizer, "long prompt =")]
    stop = stops(model, tokenizer, "chat")
    assert generate(model, tokenizer, prompts, [10, 10], 2, stop).texts == ["4", "abcd"]
    assert generate(model, tokenizer, prompts, [10, 10], 2).texts == ["4zzzzzzzz", "abcdzzzzz"]  # EOS only: run on


def test_eval_out_of_memory_is_one_line_naming_the_batch(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import tunelab.eval.generate as generate_module

    def evaluate(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(generate_module, "evaluate", evaluate)
    path = write_jsonl(tmp_path / "rows.jsonl", [{"instruction": "1 + 1", "output": "1 + 1 = 2", "answer": "2"}])
    out = tmp_path / "eval.json"
    argv = ["eval", "--data", str(path), "--model", str(tiny_model_dir), "--batch-size", "64", "--out", str(out)]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "out of memory on " in line and "generating 64 rows at a time; lower --batch-size" in line
    assert not out.exists()
