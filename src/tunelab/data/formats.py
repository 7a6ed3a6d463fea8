"""Rendering a dataset row into text segments, each marked trainable or not.

A row becomes a list of `Segment(text, trainable)`. The prompt parts are not trainable (masked from the
loss unless `train_on_inputs`), the response parts are. Generation (`tunelab eval`) uses `prompt_text`,
the exact prompt training saw, so train and eval can never drift apart.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import TunelabError

# Alpaca's original template (Taori et al. 2023, stanford_alpaca/train.py); a compact one that drops the
# ~30-token preamble: on short rows such as arithmetic the preamble is most of the compute; and a bare one,
# the instruction and a newline, for tasks that need no framing (8 tokens fewer a row than compact).
TEMPLATES = {
    "alpaca": {
        "with_input": (
            "Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n"
            "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
        ),
        "no_input": (
            "Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.\n\n"
            "### Instruction:\n{instruction}\n\n### Response:\n"
        ),
    },
    "compact": {
        "with_input": "### Instruction:\n{instruction}\n{input}\n### Response:\n",
        "no_input": "### Instruction:\n{instruction}\n### Response:\n",
    },
    "bare": {
        "with_input": "{instruction}\n{input}\n",
        "no_input": "{instruction}\n",
    },
}

# The roles chat templates know; a misspelt one would be rendered as-is and trained on silently.
CHAT_ROLES = ("system", "user", "assistant", "tool")

# ShareGPT's `from` values as chat roles. `function_call` is the model's own output (a call it learns to make),
# so it is an assistant turn and trained on; `observation` is a tool's result fed back, so it is a tool turn.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "observation": "tool",
}

# Formats whose rows are conversations, rendered by the tokenizer's chat template.
CONVERSATION_FORMATS = ("chat", "sharegpt")

# ChatML, the default for a tokenizer without a chat template of its own: every turn is
# `<|im_start|>role\ncontent<|im_end|>\n`, and the generation prompt is `<|im_start|>assistant\n`.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The fields a format renders as text: a number is written as it reads, a list or an object is an error.
TEXT_FIELDS = {
    "alpaca": ("instruction", "input", "output"),
    "completion": ("prompt", "completion"),
    "text": ("text",),
    "alpaca-prompt": ("instruction", "input"),
    "completion-prompt": ("prompt",),
}

# Prompt rows (objective grpo): a format's prompt without the response it would train on; the model writes the
# responses, and the row's other fields (an `answer`) stay for the rewards.
PROMPT_FORMATS = {"alpaca": "alpaca-prompt", "completion": "completion-prompt", "chat": "chat-prompt"}

REQUIRED_FIELDS = {
    "alpaca": ("instruction", "output"),
    "chat": ("messages",),
    "completion": ("prompt", "completion"),
    "sharegpt": ("conversations",),
    "text": ("text",),
    # A preference pair (objective dpo or orpo): a prompt and two responses to it, the chosen one first.
    "preference": ("prompt", "chosen", "rejected"),
    "alpaca-prompt": ("instruction",),
    "completion-prompt": ("prompt",),
    "chat-prompt": ("messages",),
}


@dataclass(frozen=True)
class Segment:
    text: str
    trainable: bool


def check_fields(fmt: str, row: dict[str, Any], where: str) -> None:
    missing = [f for f in REQUIRED_FIELDS[fmt] if f not in row or row[f] is None]
    if missing:
        raise TunelabError(
            f"{where}: missing field {', '.join(repr(m) for m in missing)} for format {fmt!r} "
            f"(it needs {', '.join(REQUIRED_FIELDS[fmt])}; set data.format to match the file)"
        )
    for field in TEXT_FIELDS.get(fmt, ()):
        if isinstance(row.get(field), (list, dict)):
            kind = "a list" if isinstance(row[field], list) else "an object"
            raise TunelabError(
                f"{where}: field {field!r} is {kind}, not text; format {fmt!r} renders its fields as text "
                "(a conversation is data.format=chat with a messages list)"
            )
    if fmt == "preference":
        check_pair(row, where)
    elif fmt in ("chat", "chat-prompt"):
        check_messages(row["messages"], where)
    elif fmt == "sharegpt":
        check_conversations(row["conversations"], where)
    # The prompt a reply is trained (and generated) after is the conversation before it; a chat template
    # cannot render an empty one.
    if fmt in CONVERSATION_FORMATS and conversation(fmt, row)[0]["role"] == "assistant":
        raise TunelabError(
            f"{where}: the conversation opens with an assistant turn, with no prompt before it; "
            "start it with a system or user message"
        )


def check_pair(row: dict[str, Any], where: str) -> None:
    """A preference row: each field text or a list of chat messages, both responses non-empty and different."""
    for field in ("prompt", "chosen", "rejected"):
        value = row[field]
        if isinstance(value, list):
            check_messages(value, where)
        elif not isinstance(value, str):
            raise TunelabError(f"{where}: field {field!r} must be text or a list of chat messages")
    for field in ("chosen", "rejected"):
        if not pair_response(row, field)[1]:
            raise TunelabError(f"{where}: field {field!r} has an empty response; fix or remove the row")
    if pair_response(row, "chosen") == pair_response(row, "rejected"):
        raise TunelabError(f"{where}: chosen and rejected are the same response; a pair must differ, remove the row")


def pair_messages(value: str | list, role: str) -> list[dict[str, Any]]:
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def pair_response(row: dict[str, Any], field: str) -> tuple[list[dict[str, Any]], str]:
    """(prompt messages, response text) of one side of a pair. A side may hold the whole conversation (the
    binarized UltraFeedback layout: its turns before the last assistant turns repeat the prompt) or the response
    alone."""
    prompt, side = row["prompt"], row[field]
    if isinstance(side, str):
        return pair_messages(prompt, "user"), side
    cut = len(side)
    while cut > 0 and side[cut - 1].get("role") == "assistant":
        cut -= 1
    head = side[:cut] if cut else pair_messages(prompt, "user")
    text = "".join(str(m.get("content") or "") for m in side[cut:])
    return head, text


def render_pair_side(
    fmt: str, template: str, row: dict[str, Any], field: str, eos: str, tokenizer=None
) -> list[Segment]:
    """Segments of one side of a preference pair: the prompt (not trainable), then the response. Text fields
    render as `fmt` renders them (alpaca: the prompt is the instruction; completion: as written; chat: a user
    turn and an assistant turn); a message list always renders with the chat template."""
    prompt, side = row["prompt"], row[field]
    if fmt != "chat" and isinstance(prompt, str) and isinstance(side, str):
        head = _alpaca_prompt(template, {"instruction": prompt}) if fmt == "alpaca" else prompt
        return [Segment(head, False), Segment(f"{side}{eos}", True)]
    head, _ = pair_response(row, field)
    tail = (
        side[len(side) - _assistant_tail(side) :]
        if isinstance(side, list)
        else [{"role": "assistant", "content": side}]
    )
    apply = _apply_chat(tokenizer)
    header = apply(head, tokenize=False, add_generation_prompt=True)
    full = apply(head + tail, tokenize=False)
    segments: list[Segment] = []
    _extend(segments, "", header, False)
    _extend(segments, header, full, True)
    return segments


def _assistant_tail(messages: list[dict[str, Any]]) -> int:
    n = 0
    while n < len(messages) and messages[len(messages) - 1 - n].get("role") == "assistant":
        n += 1
    return n


def check_messages(messages: Any, where: str) -> None:
    """A chat row's `messages`: a non-empty list of {role, content} with roles from CHAT_ROLES."""
    _check_turns(messages, where, "messages", "message", ("role", "content"), CHAT_ROLES)
    for i, message in enumerate(messages):
        # An assistant turn that only calls tools has no text (OpenAI's form); the model's template renders
        # its tool_calls.
        if message["content"] is None and message.get("tool_calls"):
            continue
        if not isinstance(message["content"], str):
            raise TunelabError(
                f"{where}: message {i} has a 'content' that is not a string (null only beside 'tool_calls')"
            )


def check_conversations(turns: Any, where: str) -> None:
    """A ShareGPT row's `conversations`: a non-empty list of {from, value} with `from` in SHAREGPT_ROLES."""
    _check_turns(turns, where, "conversations", "conversations turn", ("from", "value"), SHAREGPT_ROLES)
    for i, turn in enumerate(turns):
        if not isinstance(turn["value"], str):
            raise TunelabError(f"{where}: conversations turn {i} has a 'value' that is not a string")


def _check_turns(turns: Any, where: str, field: str, item: str, keys: tuple[str, str], roles) -> None:
    """`turns` is a non-empty list of objects with both `keys`, the first of which names a role in `roles`."""
    role_key, text_key = keys
    if not isinstance(turns, list) or not turns:
        raise TunelabError(f"{where}: '{field}' must be a non-empty list of {{{role_key}, {text_key}}} objects")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise TunelabError(f"{where}: {item} {i} needs '{role_key}' and '{text_key}'")
        role = turn[role_key]
        if role not in roles:
            close = difflib.get_close_matches(str(role), roles, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            named = "role" if role_key == "role" else f"'{role_key}'"
            raise TunelabError(f"{where}: {item} {i} has {named} {role!r}{hint}; use one of {', '.join(roles)}")


def sharegpt_messages(turns: list[dict[str, Any]]) -> list[dict[str, str]]:
    """ShareGPT turns as chat messages ({role, content}), roles mapped by SHAREGPT_ROLES."""
    return [{"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in turns]


def conversation(fmt: str, row: dict[str, Any]) -> list[dict[str, str]]:
    """A conversation row's chat messages, whichever of CONVERSATION_FORMATS it is in."""
    return sharegpt_messages(row["conversations"]) if fmt == "sharegpt" else row["messages"]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def effective_chat_template(tokenizer) -> str:
    """The template conversations are rendered with: the tokenizer's own, else CHATML_TEMPLATE."""
    return tokenizer.chat_template if has_chat_template(tokenizer) else CHATML_TEMPLATE


def use_default_chat_template(tokenizer, fmt: str, model: str) -> str | None:
    """Give a tokenizer without a chat template ChatML, when `fmt` needs one; the line that says so, else None.

    Setting it on the tokenizer (not only rendering with it) is what saves it beside the trained weights, so
    inference with them renders conversations as training did.
    """
    if fmt not in CONVERSATION_FORMATS or has_chat_template(tokenizer):
        return None
    tokenizer.chat_template = CHATML_TEMPLATE
    return f"model {model} has no chat template; using ChatML"


def _apply_chat(tokenizer) -> Callable:
    template = effective_chat_template(tokenizer)

    def apply(messages, **kwargs):
        return tokenizer.apply_chat_template(messages, chat_template=template, **kwargs)

    return apply


def prompt_text(fmt: str, template: str, row: dict[str, Any], tokenizer=None) -> str:
    """The text a model is given to generate this row's response (everything before it in training)."""
    if fmt == "alpaca":
        return _alpaca_prompt(template, row)
    if fmt == "completion":
        return str(row["prompt"])
    if fmt in CONVERSATION_FORMATS:
        return chat_prompt(tokenizer, [m for m in conversation(fmt, row) if m.get("role") != "assistant"])
    return ""


def chat_prompt(tokenizer, messages: list[dict[str, str]]) -> str:
    """A conversation's text up to the assistant's next turn, in the template training renders conversations with
    (`tunelab serve`'s chat completions, and eval's prompt for a conversation row)."""
    return _apply_chat(tokenizer)(messages, tokenize=False, add_generation_prompt=True)


def _alpaca_prompt(template: str, row: dict[str, Any]) -> str:
    extra = row.get("input")
    if extra:
        return TEMPLATES[template]["with_input"].format(instruction=row["instruction"], input=extra)
    return TEMPLATES[template]["no_input"].format(instruction=row["instruction"])


def render(fmt: str, template: str, row: dict[str, Any], eos: str, tokenizer=None) -> list[Segment]:
    """Segments of one row. The response ends with `eos` so a tuned model learns to stop."""
    if fmt == "alpaca":
        return [Segment(_alpaca_prompt(template, row), False), Segment(f"{row['output']}{eos}", True)]
    if fmt == "completion":
        return [Segment(str(row["prompt"]), False), Segment(f"{row['completion']}{eos}", True)]
    if fmt == "text":
        return [Segment(f"{row['text']}{eos}", True)]
    return _render_chat(conversation(fmt, row), _apply_chat(tokenizer))


def _render_chat(messages: list[dict[str, str]], apply: Callable) -> list[Segment]:
    """Split the chat-template rendering at message boundaries by rendering growing prefixes.

    Each assistant turn's content (and the template's end-of-turn marker) is trainable; the role header
    that precedes it (the generation prompt) and every other turn are not.
    """
    segments: list[Segment] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            header = apply(messages[:i], tokenize=False, add_generation_prompt=True)
            _extend(segments, done, header, False)
            done = header
        full = apply(messages[: i + 1], tokenize=False)
        _extend(segments, done, full, message["role"] == "assistant")
        done = full
    return segments


def _extend(segments: list[Segment], done: str, now: str, trainable: bool) -> None:
    if not now.startswith(done):
        raise TunelabError(
            "chat row: the model's chat template does not render message prefixes consistently, "
            "so prompt masking cannot be located; use format 'completion' instead"
        )
    if len(now) > len(done):
        segments.append(Segment(now[len(done) :], trainable))
