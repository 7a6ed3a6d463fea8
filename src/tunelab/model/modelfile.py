"""An Ollama Modelfile for an exported GGUF: `ollama create NAME -f Modelfile` is the next command.

The TEMPLATE is the prompt the model was trained with: the alpaca-format templates of data/formats.py, or, for
conversations, the chat template translated to Ollama's Go template where it is ChatML (`<|im_start|>role`
... `<|im_end|>`). Any other chat template is left out: Ollama then reads tokenizer.chat_template from the GGUF.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..data.formats import CONVERSATION_FORMATS, TEMPLATES

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
# Ollama's ChatML template: an optional system turn, each message, then the assistant's turn to complete.
OLLAMA_CHATML = (
    "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n"
)


@dataclass(frozen=True)
class PromptSpec:
    """How the run rendered its rows (data.format, data.template of its config.yaml)."""

    format: str = "chat"
    template: str = "alpaca"


def modelfile(
    source: str, prompt: PromptSpec, chat_template: str | None, eos: str | None, adapter: str | None = None
) -> str:
    """The Modelfile's text. `source` is FROM (a path or an Ollama model), `adapter` an ADAPTER path."""
    lines = [f"FROM {source}"]
    if adapter:
        lines.append(f"ADAPTER {adapter}")
    template, system, stops = _template(prompt, chat_template)
    if template is not None:
        lines.append(f'TEMPLATE """{template}"""')
    if system:
        lines.append(f'SYSTEM """{system}"""')
    for stop in dict.fromkeys([*stops, *([eos] if eos else [])]):
        lines.append(f"PARAMETER stop {_quote(stop)}")
    # tunelab eval scores greedy decoding; the model is measured as it answers at temperature 0.
    lines.append("PARAMETER temperature 0")
    return "\n".join(lines) + "\n"


def _template(prompt: PromptSpec, chat_template: str | None) -> tuple[str | None, str | None, list[str]]:
    if prompt.format == "alpaca":
        text = TEMPLATES[prompt.template]["no_input"].replace("{instruction}", "{{ .Prompt }}")
        return text, None, []
    if prompt.format in CONVERSATION_FORMATS:
        if chat_template and CHATML_START in chat_template and CHATML_END in chat_template:
            return OLLAMA_CHATML, default_system(chat_template), [CHATML_END]
        return None, None, []
    return "{{ .Prompt }}", None, []  # completion and text: the prompt as it is


def default_system(chat_template: str) -> str | None:
    """The system turn a ChatML template inserts when the conversation has none (SmolLM2's, Qwen's)."""
    found = re.search(r"<\|im_start\|>system\\n(.*?)<\|im_end\|>", chat_template, re.S)
    if found is None:
        found = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", chat_template, re.S)
    return found.group(1) if found and "{{" not in found.group(1) else None


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
