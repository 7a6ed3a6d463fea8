"""Conversation rows (chat and ShareGPT): the default ChatML template, its loss masking, ShareGPT's role mapping
and the one-line errors of malformed rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_tokenizer, write_jsonl

from tunelab.config import load_config
from tunelab.data.examples import IGNORE
from tunelab.data.formats import CHATML_TEMPLATE, prompt_text, use_default_chat_template
from tunelab.data.pipeline import DataSpec, prepare
from tunelab.errors import TunelabError

MESSAGES = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "a"},
]
SHAREGPT = [
    {"from": "system", "value": "S"},
    {"from": "human", "value": "hi"},
    {"from": "gpt", "value": "yo"},
    {"from": "human", "value": "q"},
    {"from": "gpt", "value": "a"},
]
# MESSAGES rendered in ChatML, split where the loss mask changes: only assistant content and its end marker train.
CHATML_SPANS = [
    ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", False),
    ("yo<|im_end|>\n", True),
    ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", False),
    ("a<|im_end|>\n", True),
]


@pytest.fixture
def bare_tokenizer():
    """The test tokenizer without a chat template, as a base model's often is."""
    tok = make_tokenizer()
    tok.chat_template = None
    return tok


def spec(path, fmt, seq_len=256, train_on_inputs=False):
    return DataSpec(str(path), fmt, "alpaca", train_on_inputs, seq_len)


def spans(tokenizer, data, i=0) -> list[tuple[str, bool]]:
    """Example i as runs of (text, trained): a token is trained when the target before it predicts it."""
    start, end = data.offsets[i], data.offsets[i + 1]
    ids, targets = data.ids[start:end], data.targets[start:end]
    trained = np.concatenate([[False], targets[:-1] != IGNORE])
    assert np.array_equal(targets[:-1][trained[1:]], ids[1:][trained[1:]])  # each target is the next token
    runs: list[tuple[list[int], bool]] = []
    for token, flag in zip(ids.tolist(), trained.tolist()):
        if runs and runs[-1][1] == flag:
            runs[-1][0].append(token)
        else:
            runs.append(([token], flag))
    return [(tokenizer.decode(r), flag) for r, flag in runs]


def test_chat_without_a_template_renders_chatml_and_trains_only_assistant_turns(tmp_path, bare_tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": MESSAGES}])
    data = prepare(spec(path, "chat"), bare_tokenizer)
    assert spans(bare_tokenizer, data) == CHATML_SPANS
    assert data.stats.tokens_loss == len(bare_tokenizer("yo<|im_end|>\na<|im_end|>\n")["input_ids"])
    # Rendering falls back without changing the tokenizer: plan and eval see the same text as train.
    assert bare_tokenizer.chat_template is None


def test_chatml_default_matches_the_same_template_set_explicitly(tmp_path, bare_tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": MESSAGES}])
    default = prepare(spec(path, "chat"), bare_tokenizer)
    explicit = make_tokenizer()
    explicit.chat_template = CHATML_TEMPLATE
    given = prepare(spec(path, "chat"), explicit)
    assert np.array_equal(default.ids, given.ids) and np.array_equal(default.targets, given.targets)


def test_chatml_prompt_ends_with_the_generation_prompt(bare_tokenizer):
    row = {"messages": MESSAGES[:2]}
    assert prompt_text("chat", "alpaca", row, bare_tokenizer) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_default_template_is_set_and_announced_only_where_needed(bare_tokenizer):
    assert use_default_chat_template(bare_tokenizer, "alpaca", "m") is None
    assert bare_tokenizer.chat_template is None
    assert use_default_chat_template(bare_tokenizer, "sharegpt", "base-model") == (
        "model base-model has no chat template; using ChatML"
    )
    assert bare_tokenizer.chat_template == CHATML_TEMPLATE
    own = make_tokenizer()
    template = own.chat_template
    assert use_default_chat_template(own, "chat", "m") is None and own.chat_template == template


def test_train_on_inputs_trains_every_turn(tmp_path, bare_tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": MESSAGES}])
    data = prepare(spec(path, "chat", train_on_inputs=True), bare_tokenizer)
    assert data.stats.tokens_loss == data.stats.tokens_nonpad - 1


@pytest.mark.parametrize("own_template", [True, False])
def test_sharegpt_is_the_same_examples_as_chat(tmp_path, own_template):
    tok = make_tokenizer()
    if not own_template:
        tok.chat_template = None
    chat = prepare(spec(write_jsonl(tmp_path / "c.jsonl", [{"messages": MESSAGES}]), "chat"), tok)
    share = prepare(spec(write_jsonl(tmp_path / "s.jsonl", [{"conversations": SHAREGPT}]), "sharegpt"), tok)
    assert np.array_equal(chat.ids, share.ids) and np.array_equal(chat.targets, share.targets)
    assert spans(tok, share) == CHATML_SPANS


def test_sharegpt_roles_map_to_chat_roles(tmp_path, bare_tokenizer):
    """function_call is the model's output (trained), observation a tool's result (not trained); the chat role
    names are accepted as themselves."""
    turns = [
        {"from": "user", "value": "w?"},
        {"from": "function_call", "value": "f()"},
        {"from": "observation", "value": "9"},
        {"from": "tool", "value": "8"},
        {"from": "assistant", "value": "7"},
    ]
    data = prepare(spec(write_jsonl(tmp_path / "s.jsonl", [{"conversations": turns}]), "sharegpt"), bare_tokenizer)
    assert spans(bare_tokenizer, data) == [
        ("<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n", False),
        ("f()<|im_end|>\n", True),
        ("<|im_start|>tool\n9<|im_end|>\n<|im_start|>tool\n8<|im_end|>\n<|im_start|>assistant\n", False),
        ("7<|im_end|>\n", True),
    ]


def test_sharegpt_prompt_is_the_conversation_before_the_reply(bare_tokenizer):
    row = {"conversations": SHAREGPT[:3]}
    assert prompt_text("sharegpt", "alpaca", row, bare_tokenizer) == prompt_text(
        "chat", "alpaca", {"messages": MESSAGES[:2]}, bare_tokenizer
    )


GOOD = json.dumps({"conversations": SHAREGPT})


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"messages": []}', r"s\.jsonl:2: missing field 'conversations' for format 'sharegpt'"),
        ('{"conversations": []}', r"s\.jsonl:2: 'conversations' must be a non-empty list"),
        ('{"conversations": "hi"}', r"s\.jsonl:2: 'conversations' must be a non-empty list"),
        ('{"conversations": [{"from": "human"}]}', r"s\.jsonl:2: conversations turn 0 needs 'from' and 'value'"),
        ('{"conversations": [{"role": "user", "content": "x"}]}', r"s\.jsonl:2: conversations turn 0 needs 'from'"),
        (
            '{"conversations": [{"from": "human", "value": "x"}, {"from": "humna", "value": "y"}]}',
            r"s\.jsonl:2: conversations turn 1 has 'from' 'humna' \(did you mean 'human'\?\); use one of system, human",
        ),
        (
            '{"conversations": [{"from": "chatgpt", "value": "y"}]}',
            r"s\.jsonl:2: conversations turn 0 has 'from' 'chatgpt' \(did you mean 'gpt'\?\)",
        ),
        ('{"conversations": [{"from": "gpt", "value": 3}]}', r"s\.jsonl:2: conversations turn 0 has a 'value' that"),
    ],
)
def test_bad_sharegpt_rows_name_file_line_and_field(tmp_path, tokenizer, line, message):
    path = tmp_path / "s.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(TunelabError, match=message) as e:
        prepare(spec(path, "sharegpt"), tokenizer)
    assert "\n" not in str(e.value)


def test_config_accepts_sharegpt_and_refuses_a_template_for_it():
    assert load_config(None, ["data.format=sharegpt"]).data.format == "sharegpt"
    with pytest.raises(TunelabError, match="data.template applies to the alpaca format only"):
        load_config(None, ["data.format=sharegpt", "data.template=compact"])
    with pytest.raises(TunelabError, match=r"did you mean 'sharegpt'"):
        load_config(None, ["data.format=sharegtp"])


def test_an_assistant_turn_that_only_calls_tools_may_have_no_content():
    from tunelab.data.formats import check_messages

    call = {"type": "function", "function": {"name": "weather", "arguments": "{}"}}
    check_messages(
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "sunny"},
        ],
        "d.jsonl:1",
    )
    with pytest.raises(TunelabError, match="null only beside 'tool_calls'"):
        check_messages([{"role": "user", "content": None}], "d.jsonl:1")
