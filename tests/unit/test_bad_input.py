"""Bad input through the real command line, in-process: every case exits 2 with one line naming the file, line
or key at fault, and leaves nothing behind (no output_dir, no --out file, no stray file beside the inputs)."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import tiny_train_config, write_jsonl
from safetensors import SafetensorError

from tunelab.cli import main
from tunelab.train import checkpoint

ROWS = [{"instruction": f"{i} + 1", "output": f"{i + 1}", "answer": str(i + 1)} for i in range(8)]
CHAT_FORMAT = (("data.format", "chat"), ("data.template", "alpaca"))
CHAT = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 4


@dataclass(frozen=True)
class Env:
    """What a case builds its inputs from: the test's own folder and the shared tiny model and checkpoint."""

    tmp: Path
    model: Path
    checkpoint: Path

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    def config(self, body: str | dict, name: str = "c.yaml") -> str:
        """A config file over the tiny model (its keys first, `body` after); a str body is written verbatim."""
        path = self.tmp / name
        if isinstance(body, str):
            path.write_text(body)
        else:
            base = {
                "model": str(self.model),
                "output_dir": str(self.out),
                "data": {"path": str(self.data()), "template": "compact"},
                "seq_len": 64,
                "micro_batch": 2,
                "precision": "fp32",
            }
            for key, value in body.items():
                node = base
                *parents, leaf = key.split(".")
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = value
            path.write_text(yaml.safe_dump(base))
        return str(path)

    def data(self, name: str = "d.jsonl", rows: list | None = None, raw: bytes | None = None) -> Path:
        path = self.tmp / name
        if raw is not None:
            path.write_bytes(raw)
        elif not path.exists() or rows is not None:
            write_jsonl(path, ROWS if rows is None else rows)
        return path

    def train(self, body: dict | str, *overrides: str) -> list[str]:
        return ["train", "--config", self.config(body), "--quiet", *overrides]

    def train_on(self, name: str, raw: bytes | str | list, *extra: tuple[str, object]) -> list[str]:
        """`train` over a data file `name` holding `raw` (bytes, text, or rows written as jsonl)."""
        if isinstance(raw, list):
            path = self.data(name, rows=raw)
        else:
            path = self.data(name, raw=raw.encode() if isinstance(raw, str) else raw)
        return self.train({"data.path": str(path), **dict(extra)})

    def adapter(self, name: str = "run") -> Path:
        """A run folder with an adapter_config.json and the run's config.yaml: enough to pass the first checks."""
        folder = self.tmp / name / "adapter"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        self.config({}, name=f"{name}/config.yaml")
        return folder


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Env], list[str]]  # writes the inputs, returns argv
    names: tuple[str, ...]  # what the one error line must contain (file, line, key, what to do)


def case(id: str, build: Callable[[Env], list[str]], *names: str):
    return pytest.param(Case(id, build, names), id=id)


def lines(*text: str) -> bytes:
    return "".join(t + "\n" for t in text).encode()


def good(i: int = 0) -> str:
    return json.dumps(ROWS[i])


def chat_row(*messages: dict) -> dict:
    return {"messages": list(messages)}


def copy_model(env: Env, name: str, weights: bool = True) -> Path:
    """The tiny model copied to `name`, with or without its weights file."""
    folder = env.tmp / name
    folder.mkdir()
    for item in env.model.iterdir():
        if weights or item.suffix != ".safetensors":
            (folder / item.name).write_bytes(item.read_bytes())
    return folder


def foreign_adapter(env: Env, targets: list[str], config_targets: list[str] | None = None, **shape) -> Path:
    """A real (untrained) LoRA adapter saved from a tiny Llama of another `shape`, in a run folder whose
    config.yaml names the test's own tiny model: what a user gets pointing one run's adapter at another base."""
    from conftest import make_tiny_llama
    from peft import LoraConfig, get_peft_model

    folder = env.adapter("foreign")
    vocab = json.loads((env.model / "config.json").read_text())["vocab_size"]
    model = get_peft_model(make_tiny_llama(vocab, **shape), LoraConfig(r=4, target_modules=targets))
    model.save_pretrained(folder)
    if config_targets is not None:  # as an adapter of a model with other module names records them
        config = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**config, "target_modules": config_targets}))
    return folder


def damaged_adapter(env: Env, config: str, weights: bytes | None = None) -> Path:
    """A run folder whose adapter has `config` as adapter_config.json and `weights` as its safetensors file."""
    folder = env.adapter()
    (folder / "adapter_config.json").write_text(config)
    if weights is not None:
        (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


DATA = {"rows": 8, "prompt_tokens": "4-8", "response_tokens": "4-8"}
SUITE_ROW = {"name": "a", "model": "random:smollm2-135m", "method": "lora", "steps": 1}


FIT_ROW = {
    "device": "h200",
    "kind": "cuda",
    "label": "1b-lora",
    "source": "a results file row 1b-lora",
    "model": "random:llama-3.2-1b",
    "method": "lora",
    "micro_batch": 8,
    "seq_len": 2048,
    "compiled": False,
    "grad_ckpt": False,
    "measured_s": 0.27,
    "peak": 989e12,
    "bandwidth": 4.8e12,
    "r": 16,
    "compute_bytes": 2,
    "packing": True,
    "lengths": "mean:500",
    "loss_fraction": 0.5,
}


def fit_rows(env: Env, change: dict, **keys) -> list[str]:
    """`bench fit` over a folder of one row file: one valid row but for `change` (None drops a key), and `keys`."""
    row = {k: v for k, v in {**FIT_ROW, **change}.items() if v is not None}
    (env.tmp / "rows").mkdir(exist_ok=True)
    (env.tmp / "rows" / "1_rows.yaml").write_text(yaml.safe_dump({"date": "2026-12-01", "rows": [row], **keys}))
    return ["bench", "fit", "--rows", str(env.tmp / "rows")]


def suite(env: Env, *overrides: str, raw: bytes | None = None, rows: object = None, **keys) -> list[str]:
    """`bench suite` over a suites file of one suite `mini` (a valid one but for `rows` and `keys`)."""
    if raw is None:
        body = {"data": DATA, "rows": rows or [SUITE_ROW]}
        raw = yaml.safe_dump({"suites": {"mini": {**body, **keys}}}).encode()
    path = env.data("s.yaml", raw=raw)
    return ["bench", "suite", str(path), "--out", str(env.out), f"output_dir={env.tmp / 'runs'}", *overrides]


def corrupt_checkpoint(env: Env) -> list[str]:
    step = env.out / "checkpoints" / "step-0000002"
    step.mkdir(parents=True)
    (step / "state.json").write_text("{}")
    return env.train({"resume": True})


CASES = [
    # --- config file ---
    case("config-missing", lambda e: ["train", "--config", str(e.tmp / "nope.yaml")], "nope.yaml", "not found"),
    case("yaml-syntax", lambda e: e.train("model: x\nlr: [1e-4\nseq_len: 64\n"), "c.yaml:3:", "fix that line"),
    case(
        "config-not-utf8",
        lambda e: ["train", "--config", str(e.data("c.yaml", raw=b"seq_len: 64\nlr: 1\xff\n")), "--quiet"],
        "c.yaml:2",
        "0xff",
        "UTF-8",
    ),
    case("config-is-a-directory", lambda e: ["train", "--config", str(e.tmp)], "is a directory"),
    case("yaml-top-level-list", lambda e: e.train("- lr: 1\n- seq_len: 2\n"), "c.yaml", "mapping"),
    case("unknown-key", lambda e: e.train({"lrr": 1e-4}), "c.yaml", "'lrr'", "did you mean 'lr'"),
    case("unknown-nested-key", lambda e: e.train({"lora.rank": 8}), "'lora.rank'", "did you mean 'lora.r'"),
    case("removed-data-shuffle", lambda e: e.train({"data.shuffle": True}), "'data.shuffle'", "delete it"),
    case("section-not-mapping", lambda e: e.train({"lora": 16}), "c.yaml", "lora must be a mapping"),
    case("int-as-string", lambda e: e.train({"micro_batch": "eight"}), "micro_batch must be int", "'eight'"),
    case("float-as-list", lambda e: e.train({"lr": [1, 2]}), "c.yaml", "lr must be float"),
    case("bool-as-int", lambda e: e.train({"packing": 2}), "packing must be bool"),
    case("micro-batch-negative", lambda e: e.train({"micro_batch": -1}), "micro_batch must be at least 1"),
    case("micro-batch-zero", lambda e: e.train({"micro_batch": 0}), "micro_batch must be at least 1"),
    case("seq-len-zero", lambda e: e.train({"seq_len": 0}), "seq_len must be at least"),
    case("lr-negative", lambda e: e.train({"lr": -1e-4}), "lr must be positive"),
    case("epochs-zero", lambda e: e.train({"epochs": 0}), "epochs must be positive"),
    case("max-steps-zero", lambda e: e.train({"max_steps": 0}), "max_steps must be at least 1"),
    case("save-total-limit-zero", lambda e: e.train({"save_total_limit": 0}), "save_total_limit must be at least 1"),
    case("lr-nan", lambda e: e.train({}, "lr=.nan"), "lr must be a finite number", "nan"),
    case("epochs-inf", lambda e: e.train({"epochs": float("inf")}), "epochs must be a finite number"),
    case("seed-negative", lambda e: e.train({"seed": -1}), "seed must be in [0, 2**32)"),
    case("seed-too-large", lambda e: e.train({"seed": 2**32}), "seed must be in [0, 2**32)"),
    case("weight-decay-negative", lambda e: e.train({"weight_decay": -0.1}), "weight_decay must be 0 or positive"),
    case("max-grad-norm-negative", lambda e: e.train({"max_grad_norm": -1}), "max_grad_norm", "0 for no clipping"),
    case("lora-alpha-zero", lambda e: e.train({"lora.alpha": 0}), "lora.alpha must be positive"),
    case("output-dir-empty", lambda e: e.train({"output_dir": ""}), "output_dir is empty"),
    case("dropout-one", lambda e: e.train({"lora.dropout": 1.0}), "lora.dropout must be in [0, 1)"),
    case("warmup-ratio-one", lambda e: e.train({"warmup_ratio": 1}), "warmup_ratio must be in [0, 1)"),
    case("unknown-method", lambda e: e.train({"method": "lorra"}), "method must be one of", "did you mean 'lora'"),
    case("unknown-format", lambda e: e.train({"data.format": "alpacca"}), "data.format", "did you mean 'alpaca'"),
    case("unknown-precision", lambda e: e.train({"precision": "bf32"}), "precision must be one of"),
    case("unknown-attention", lambda e: e.train({"attention": "flash"}), "attention must be one of"),
    case("unknown-scheduler", lambda e: e.train({"lr_scheduler": "cosin"}), "lr_scheduler", "'cosine'"),
    case("unknown-target-preset", lambda e: e.train({"lora.targets": "atn"}), "lora.targets", "'attn'"),
    case("qlora-with-int8", lambda e: e.train({"method": "qlora", "base_quant": "int8"}), "base_quant: int8"),
    case("full-with-nf4", lambda e: e.train({"method": "full", "base_quant": "nf4"}), "base_quant"),
    case(
        "template-on-chat", lambda e: e.train({"data.format": "chat", "data.template": "bare"}), "data.template", "chat"
    ),
    # --- overrides ---
    case("override-without-equals", lambda e: e.train({}, "foo"), "'foo'", "key=value"),
    case("override-bad-int", lambda e: e.train({}, "lora.r=abc"), "lora.r must be int", "'abc'"),
    case("override-into-value", lambda e: e.train({"lr": 1e-4}, "lr.x=1"), "'lr' is not a section"),
    case("override-unknown-key", lambda e: e.train({}, "lora.rr=8"), "'lora.rr'", "did you mean 'lora.r'"),
    # --- data files ---
    case("data-missing", lambda e: e.train({"data.path": str(e.tmp / "nope.jsonl")}), "nope.jsonl", "not found"),
    case("data-path-unset", lambda e: e.train({"data.path": None}), "data.path is not set"),
    case("data-is-a-directory", lambda e: e.train({"data.path": str(e.tmp)}), "is a directory", "set data.path"),
    case(
        "eval-path-missing",
        lambda e: e.train({"eval.path": str(e.tmp / "nope.jsonl")}),
        "nope.jsonl",
        "not found (set eval.path)",
    ),
    case(
        "mix-part-missing",
        lambda e: e.train(
            {"data.path": None, "data.mix": [{"path": str(e.data())}, {"path": str(e.tmp / "nope.jsonl")}]}
        ),
        "nope.jsonl",
        "not found (set data.mix[1].path)",
    ),
    case(
        "alpaca-output-list",
        lambda e: e.train_on("o.jsonl", lines(good(), '{"instruction": "x", "output": ["1", "2"]}')),
        "o.jsonl:2",
        "'output' is a list",
    ),
    case("data-empty", lambda e: e.train_on("empty.jsonl", b""), "empty.jsonl", "empty"),
    case("data-blank-lines", lambda e: e.train_on("blank.jsonl", b"\n \n"), "blank.jsonl", "empty"),
    case("json-malformed", lambda e: e.train_on("bad.json", '[{"instruction": "a", '), "bad.json", "cannot be read"),
    case("jsonl-bad-line-3", lambda e: e.train_on("bad.jsonl", lines(good(), good(), "{oops")), "bad.jsonl:3", "JSON"),
    case(
        "jsonl-missing-output",
        lambda e: e.train_on("m.jsonl", lines(good(), '{"instruction": "x"}')),
        "m.jsonl:2",
        "'output'",
    ),
    case(
        "jsonl-missing-instruction",
        lambda e: e.train_on("m.jsonl", lines('{"output": "x"}')),
        "m.jsonl:1",
        "'instruction'",
    ),
    case("jsonl-row-is-list", lambda e: e.train_on("l.jsonl", lines(good(), "[1, 2]")), "l.jsonl:2", "JSON object"),
    case(
        "jsonl-not-utf8",
        lambda e: e.train_on("u.jsonl", good().encode() + b"\n" + b'{"instruction": "\xff\xfe", "output": "1"}\n'),
        "u.jsonl:2",
        "UTF-8",
        "byte",
    ),
    case(
        "jsonl-huge-row",
        lambda e: e.train_on("huge.jsonl", lines(good(), json.dumps({"instruction": "x" * 10_000_000, "output": "1"}))),
        "huge.jsonl:2",
        "bytes",
    ),
    case(
        "csv-not-utf8", lambda e: e.train_on("u.csv", b"instruction,output\n\xff\xfe,1\n"), "u.csv:2", "UTF-8", "0xff"
    ),
    case("csv-ragged", lambda e: e.train_on("r.csv", b"instruction,output\na,1\nb,2,3,4\n"), "r.csv", "line 3"),
    case("csv-missing-column", lambda e: e.train_on("c.csv", b"instruction,answer\na,1\n"), "c.csv", "'output'"),
    case("parquet-corrupt", lambda e: e.train_on("x.parquet", random.Random(0).randbytes(4096)), "x.parquet"),
    case("unknown-extension", lambda e: e.train_on("d.txt", lines(good())), "d.txt", ".jsonl"),
    case(
        "chat-missing-messages",
        lambda e: e.train_on("chat.jsonl", [CHAT[0], {"turns": []}], *CHAT_FORMAT),
        "chat.jsonl:2",
        "'messages'",
    ),
    case(
        "chat-messages-not-list",
        lambda e: e.train_on("chat.jsonl", [{"messages": "hi"}], *CHAT_FORMAT),
        "chat.jsonl:1",
        "messages",
    ),
    case(
        "chat-bad-role",
        lambda e: e.train_on(
            "chat.jsonl",
            [CHAT[0], chat_row({"role": "usr", "content": "a"}, {"role": "assistant", "content": "b"})],
            *CHAT_FORMAT,
        ),
        "chat.jsonl:2",
        "'usr'",
        "'user'",
    ),
    case(
        "chat-message-without-content",
        lambda e: e.train_on("chat.jsonl", [chat_row({"role": "user"})], *CHAT_FORMAT),
        "chat.jsonl:1",
        "content",
    ),
    case(
        "chat-content-not-string",
        lambda e: e.train_on(
            "chat.jsonl", [CHAT[0], chat_row({"role": "user", "content": {"text": "a"}})], *CHAT_FORMAT
        ),
        "chat.jsonl:2",
        "message 0",
        "'content'",
    ),
    case(
        "chat-opens-with-assistant",
        lambda e: e.train_on("chat.jsonl", [CHAT[0], chat_row({"role": "assistant", "content": "b"})], *CHAT_FORMAT),
        "chat.jsonl:2",
        "assistant turn",
        "user message",
    ),
    case(
        "sharegpt-opens-with-gpt",
        lambda e: e.train_on(
            "share.jsonl",
            [{"conversations": [{"from": "gpt", "value": "b"}]}],
            ("data.format", "sharegpt"),
            ("data.template", "alpaca"),
        ),
        "share.jsonl:1",
        "assistant turn",
    ),
    case(
        "sharegpt-bad-from",
        lambda e: e.train_on(
            "share.jsonl",
            [{"conversations": [{"from": "human", "value": "a"}, {"from": "gtp", "value": "b"}]}],
            ("data.format", "sharegpt"),
            ("data.template", "alpaca"),
        ),
        "share.jsonl:1",
        "turn 1",
        "'gtp'",
        "'gpt'",
    ),
    case(
        "completion-missing-field",
        lambda e: e.train_on("p.jsonl", [{"prompt": "a"}], ("data.format", "completion"), ("data.template", "alpaca")),
        "p.jsonl:1",
        "'completion'",
    ),
    # --- models ---
    case("model-missing", lambda e: e.train({"model": str(e.tmp / "nope")}), "nope", "directory"),
    case("model-dir-without-config", lambda e: e.train({"model": str(e.tmp)}), "no config.json"),
    case(
        "model-gguf-truncated",
        lambda e: e.train({"model": str(e.data("cut.gguf", raw=b"GGUF\x03\x00\x00\x00" + bytes(7)))}),
        "cut.gguf",
        "truncated",
        "download it again",
    ),
    case(
        "model-without-weights",
        lambda e: e.train({"model": str(copy_model(e, "noweights", weights=False))}),
        "noweights",
        "no weights",
    ),
    case(
        "model-not-gguf",
        lambda e: e.train({"model": str(e.data("m.gguf", raw=b"not a gguf file" * 10))}),
        "m.gguf",
        "GGUF",
    ),
    case("seq-len-over-model", lambda e: e.train({"seq_len": 4096}), "seq_len", "lower seq_len"),
    case("lora-target-not-in-model", lambda e: e.train({"lora.targets": ["foo_proj"]}), "lora.targets", "foo_proj"),
    # --- resume ---
    case("resume-path-missing", lambda e: e.train({"resume": str(e.tmp / "nope")}), "nope", "resume"),
    case("resume-all-corrupt", corrupt_checkpoint, "step-0000002", "resume: false"),
    case(
        "resume-other-lora-r",
        lambda e: e.train({"resume": str(e.checkpoint), "lora.r": 8}),
        "lora.r: 4",
        "lora.r: 8",
        "resume: false",
    ),
    case(
        "resume-other-model",
        lambda e: e.train({"resume": str(e.checkpoint), "lora.r": 4, "model": str(copy_model(e, "other"))}),
        "model:",
        "other",
    ),
    # --- plan ---
    case("plan-unknown-gpu", lambda e: ["plan", "--gpu", "h100-sxn", "--examples", "10"], "h100-sxn", "h100-sxm"),
    case(
        "plan-unknown-model", lambda e: ["plan", "--model", "acme/Nope-7B", "--examples", "10"], "acme/Nope-7B", "model"
    ),
    case("plan-zero-gpus", lambda e: ["plan", "--gpus", "0", "--examples", "10"], "--gpus"),
    case("plan-zero-examples", lambda e: ["plan", "--examples", "0"], "--examples"),
    case("plan-loss-fraction", lambda e: ["plan", "--examples", "9", "--loss-fraction", "2"], "--loss-fraction"),
    case("plan-mean-tokens-nan", lambda e: ["plan", "--examples", "9", "--mean-tokens", "nan"], "--mean-tokens"),
    case("plan-mean-tokens-inf", lambda e: ["plan", "--examples", "9", "--mean-tokens", "inf"], "--mean-tokens"),
    case("plan-price-nan", lambda e: ["plan", "--examples", "9", "--price-per-hour", "nan"], "--price-per-hour"),
    case("plan-bad-config", lambda e: ["plan", "--config", e.config({"seq_len": "long"})], "c.yaml", "seq_len"),
    # --- data ---
    case(
        "synthetic-reversed-range",
        lambda e: (
            ["data", "synthetic", "--out", str(e.out), "--rows", "5"]
            + ["--prompt-tokens", "9-3", "--response-tokens", "1-4"]
        ),
        "--prompt-tokens",
        "'9-3'",
    ),
    case(
        "synthetic-zero-rows",
        lambda e: (
            ["data", "synthetic", "--out", str(e.out), "--rows", "0"]
            + ["--prompt-tokens", "3-9", "--response-tokens", "1-4"]
        ),
        "--rows",
    ),
    case(
        "synthetic-bad-dist",
        lambda e: (
            ["data", "synthetic", "--out", str(e.out), "--rows", "5"]
            + ["--prompt-tokens", "3-9", "--response-tokens", "1-4", "--dist", "gauss"]
        ),
        "--dist",
    ),
    case(
        "synthetic-out-under-a-file",
        lambda e: (
            ["data", "synthetic", "--out", str(e.data() / "s.jsonl"), "--rows", "5"]
            + ["--prompt-tokens", "3-9", "--response-tokens", "1-4"]
        ),
        "--out",
        "d.jsonl is a file",
    ),
    case(
        "arithmetic-out-is-a-directory",
        lambda e: ["data", "arithmetic", "--out", str(e.tmp), "--n", "3"],
        "is a directory",
    ),
    case(
        "arithmetic-test-out-under-a-file",
        lambda e: (
            ["data", "arithmetic", "--out", str(e.tmp / "a.jsonl"), "--n", "3"]
            + ["--test-out", str(e.data() / "t.jsonl")]
        ),
        "--test-out",
        "d.jsonl is a file",
    ),
    case("arithmetic-bad-op", lambda e: ["data", "arithmetic", "--out", str(e.out), "--ops", "add,pow"], "pow"),
    case(
        "arithmetic-zero-digits", lambda e: ["data", "arithmetic", "--out", str(e.out), "--digits", "0-3"], "--digits"
    ),
    case("arithmetic-zero-rows", lambda e: ["data", "arithmetic", "--out", str(e.out), "--n", "0"], "--n"),
    # --- eval ---
    case(
        "eval-adapter-missing",
        lambda e: ["eval", "--data", str(e.data()), "--adapter", str(e.tmp / "gone" / "adapter")],
        "gone",
        "adapter_config.json",
    ),
    case("eval-data-missing", lambda e: ["eval", "--data", str(e.tmp / "nope.jsonl")], "nope.jsonl", "not found"),
    case("eval-data-is-a-directory", lambda e: ["eval", "--data", str(e.tmp)], "is a directory", "--data"),
    case(
        "eval-row-without-answer",
        lambda e: ["eval", "--data", str(e.data("a.jsonl", raw=lines(good(), '{"instruction": "1", "output": "2"}')))],
        "a.jsonl:2",
        "'answer'",
    ),
    case(
        "eval-chat-opens-with-assistant",
        lambda e: (
            ["eval", "--format", "chat", "--data"]
            + [str(e.data("c.jsonl", rows=[{**chat_row({"role": "assistant", "content": "2"}), "answer": "2"}]))]
        ),
        "c.jsonl:1",
        "assistant turn",
    ),
    case(
        "eval-predictions-is-a-directory",
        lambda e: ["eval", "--data", str(e.data()), "--out", str(e.tmp / "o.json"), "--predictions", str(e.tmp)],
        "--predictions",
        "is a directory",
    ),
    case(
        "eval-adapter-config-not-json",
        lambda e: ["eval", "--data", str(e.data()), "--adapter", str(damaged_adapter(e, "{oops"))],
        "adapter_config.json",
        "not an adapter config",
    ),
    case(
        "eval-adapter-weights-cut-short",
        lambda e: [
            "eval",
            "--data",
            str(e.data()),
            "--adapter",
            str(damaged_adapter(e, '{"peft_type": "LORA"}', b"\x40\x00\x00\x00\x00\x00\x00\x00{")),
        ],
        "adapter_model.safetensors",
        "cannot be read",
    ),
    case("eval-limit-zero", lambda e: ["eval", "--data", str(e.data()), "--limit", "0"], "--limit"),
    # --- export ---
    case(
        "export-out-is-a-file",
        lambda e: ["export", "--merge", "--adapter", str(e.adapter()), "--out", str(e.data("taken.bin", raw=b"x"))],
        "taken.bin",
        "--out",
    ),
    case(
        "export-out-not-empty",
        lambda e: ["export", "--merge", "--adapter", str(e.adapter()), "--out", str(e.data("full.jsonl").parent)],
        "not empty",
    ),
    case(
        "export-gguf-out-not-a-gguf-file",
        lambda e: ["export", "--format", "gguf", "--adapter", str(e.adapter()), "--out", str(e.tmp / "m.bin")],
        "--out",
        "*.gguf",
    ),
    case(
        "export-gguf-quant-unknown",
        lambda e: [
            "export",
            "--format",
            "gguf",
            "--quant",
            "q4_k_m",
            "--adapter",
            str(e.adapter()),
            "--out",
            str(e.tmp / "m.gguf"),
        ],  # fmt: skip
        "q4_k_m",
        "llama-quantize",
    ),
    case(
        "export-adapter-missing",
        lambda e: ["export", "--merge", "--adapter", str(e.tmp / "gone"), "--out", str(e.out)],
        "gone",
        "adapter_config.json",
    ),
    case(
        "export-out-under-a-file",
        lambda e: ["export", "--merge", "--adapter", str(e.adapter()), "--out", str(e.data() / "merged")],
        "--out",
        "d.jsonl is a file",
    ),
    case(
        "export-adapter-without-peft-type",
        lambda e: ["export", "--merge", "--adapter", str(e.adapter()), "--out", str(e.out)],
        "adapter_config.json",
        "no peft_type",
    ),
    case(
        "export-adapter-without-weights",
        lambda e: [
            "export",
            "--merge",
            "--adapter",
            str(damaged_adapter(e, '{"peft_type": "LORA"}')),
            "--out",
            str(e.out),
        ],
        "no adapter_model.safetensors",
    ),
    case(
        "eval-adapter-of-another-model",
        lambda e: [
            "eval",
            "--data",
            str(e.data("a.jsonl", raw=lines(good()))),
            "--adapter",
            str(foreign_adapter(e, ["q_proj"], hidden_size=32)),
        ],
        "foreign/adapter",
        "does not fit model",
        "q_proj.lora_A is [4, 32] in the adapter, [4, 64] in the model",
        "--model",
    ),
    case(
        "export-adapter-of-another-model",
        lambda e: [
            "export",
            "--adapter",
            str(foreign_adapter(e, ["q_proj"], hidden_size=32)),
            "--merge",
            "--out",
            str(e.out),
        ],
        "foreign/adapter",
        "does not fit model",
        "--model",
    ),
    case(
        "eval-adapter-of-layers-the-model-lacks",
        lambda e: [
            "eval",
            "--data",
            str(e.data("a.jsonl", raw=lines(good()))),
            "--adapter",
            str(foreign_adapter(e, ["q_proj"], ["wqkv"])),
        ],
        "foreign/adapter",
        "does not fit model",
        "wqkv",
    ),
    case("export-without-merge", lambda e: ["export", "--adapter", str(e.adapter()), "--out", str(e.out)], "--merge"),
    # --- bench ---
    case("bench-no-subcommand", lambda e: ["bench"], "name a subcommand", "run, sweep"),
    case(
        "bench-flag-form",
        lambda e: ["bench", "--config", e.config({}), "--sweep", "micro_batch=2,4"],
        "tunelab bench sweep --axis",
    ),
    case("bench-zero-steps", lambda e: ["bench", "run", "--config", e.config({}), "--steps", "0"], "--steps"),
    case("bench-sweep-without-values", lambda e: ["bench", "sweep", "--axis", "micro_batch"], "--axis", "micro_batch"),
    case("bench-export-no-db", lambda e: ["bench", "export", "csv", "--db", str(e.tmp / "x.sqlite")], "x.sqlite"),
    case(
        "bench-export-out-is-a-directory",
        lambda e: ["bench", "export", "csv", "--db", str(e.tmp / "x.sqlite"), "--out", str(e.tmp)],
        "--out",
        "is a directory",
    ),
    case(
        "bench-suite-out-is-a-file", lambda e: ["bench", "suite", "cpu", "--out", str(e.data())], "--out", "is a file"
    ),
    case(
        "bench-export-db-not-sqlite",
        lambda e: ["bench", "export", "json", "--db", str(e.data("x.sqlite", raw=b"not a database" * 10))],
        "x.sqlite",
        "not a results database",
    ),
    case(
        "bench-db-not-sqlite",
        lambda e: [
            "bench",
            "run",
            "--config",
            e.config({}),
            "--db",
            str(e.data("x.sqlite", raw=b"not a database" * 10)),
        ],
        "x.sqlite",
        "not a results database",
    ),
    case(
        "bench-db-is-a-directory",
        lambda e: ["bench", "run", "--config", e.config({}), "--db", str(e.tmp)],
        "--db",
        "is a directory",
    ),
    case("suite-not-utf8", lambda e: suite(e, raw=b"suites:\n  mini: \xff\n"), "s.yaml:2", "UTF-8"),
    case("suite-data-not-mapping", lambda e: suite(e, data=5), "suite mini", "data must be a mapping"),
    case("suite-data-bad-dist", lambda e: suite(e, data={**DATA, "dist": "gauss"}), "data.dist", "'gauss'"),
    case("suite-rows-not-list", lambda e: suite(e, rows=5), "rows must be a list"),
    case(
        "suite-row-without-steps",
        lambda e: suite(e, rows=[{k: v for k, v in SUITE_ROW.items() if k != "steps"}]),
        "row a needs steps",
    ),
    case("suite-row-steps-text", lambda e: suite(e, rows=[{**SUITE_ROW, "steps": "ten"}]), "row a", "steps", "'ten'"),
    case(
        "suite-row-compile-text", lambda e: suite(e, rows=[{**SUITE_ROW, "compile": "no"}]), "compile", "true or false"
    ),
    case("suite-row-shape-list", lambda e: suite(e, rows=[{**SUITE_ROW, "shape": [64]}]), "shape must be a mapping"),
    case(
        "suite-row-shape-on-a-hub-model",
        lambda e: suite(e, rows=[{**SUITE_ROW, "model": "acme/m", "shape": {"hidden_size": 64}}]),
        "row a",
        "shape",
        "random:",
    ),
    case(
        "suite-row-config-unknown-key",
        lambda e: suite(e, rows=[{**SUITE_ROW, "config": {"lrr": 1}}]),
        "row a",
        "'lrr'",
        "did you mean 'lr'",
    ),
    case("suite-bad-override", lambda e: suite(e, "lora.rr=8"), "'lora.rr'", "did you mean 'lora.r'"),
    case("suite-peers-list", lambda e: suite(e, peers=["trl-sft"]), "peers must be a mapping"),
    case("bench-bad-config", lambda e: ["bench", "run", "--config", e.config({"seqlen": 64})], "'seqlen'", "'seq_len'"),
    case(
        "bench-fit-row-missing-key", lambda e: fit_rows(e, {"measured_s": None}), "1_rows.yaml", "measured_s: missing"
    ),
    case("bench-fit-row-wrong-type", lambda e: fit_rows(e, {"r": "sixteen"}), "1_rows.yaml", "rows[0] (1b-lora): r"),
    case("bench-fit-row-bad-lengths", lambda e: fit_rows(e, {"lengths": "median:3"}), "1_rows.yaml", "lengths"),
    case("bench-fit-unknown-key", lambda e: fit_rows(e, {}, stepz=1), "1_rows.yaml", "unknown key 'stepz'"),
    case("bench-fit-suite-missing", lambda e: fit_rows(e, {}, suites=["nope.json"]), "1_rows.yaml", "nope.json"),
    case("bench-fit-no-rows", lambda e: ["bench", "fit", "--rows", str(e.tmp)], "no row files", "--rows"),
]


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory, tiny_model_dir) -> Path:
    """One step of a tiny LoRA run (r 4) with its checkpoint: what a resume from another config points at."""
    from tunelab.recipes.finetune import finetune
    from tunelab.train.loop import Measurement

    folder = tmp_path_factory.mktemp("ckpt")
    data = write_jsonl(folder / "d.jsonl", ROWS)
    cfg = tiny_train_config(tiny_model_dir, data, folder / "run", "lora.r=4", "save_steps=1", "max_steps=2")
    finetune(cfg, show_progress=False, measure=Measurement(stop_at=1))
    (step,) = checkpoint.list_checkpoints(folder / "run" / "checkpoints")
    return step


def snapshot(folder: Path) -> dict[str, tuple[int, int] | None]:
    """Every path under `folder` with each file's size and mtime (a folder's mtime moves when a lock comes and goes)."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    bad, tmp_path, tiny_model_dir, trained_checkpoint, capsys, caplog
):
    env = Env(tmp_path, tiny_model_dir, trained_checkpoint)
    argv = bad.build(env)
    before = snapshot(tmp_path)
    caplog.set_level(logging.WARNING)
    rc, err = run_cli(argv, capsys)
    # A library's log line would be a second line on a real terminal (capsys does not see log handlers).
    assert not caplog.records, [r.getMessage() for r in caplog.records]

    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tunelab {argv[0]}: error: "), err
    for name in bad.names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    assert snapshot(tmp_path) == before
    assert not env.out.exists() or "out" in before


def test_the_suite_covers_every_command_that_reads_input():
    ids = [p.values[0].id for p in CASES]
    assert len(ids) >= 50 and len(ids) == len(set(ids))
    firsts = {p.id.split("-")[0] for p in CASES}
    assert {"plan", "synthetic", "arithmetic", "eval", "export", "bench", "resume", "model", "jsonl", "csv"} <= firsts


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        OSError(errno.EIO, os.strerror(errno.EIO)),
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    ],
    ids=["ENOSPC", "EIO", "safetensors-ENOSPC"],
)
def test_a_full_disk_at_the_final_save_keeps_the_last_checkpoint(
    tmp_path, tiny_model_dir, monkeypatch, capsys, failure
):
    """The final adapter save fails half-way: exit 2, one line with the bytes needed, the checkpoint intact."""
    import peft.peft_model

    out = tmp_path / "run"
    data = write_jsonl(tmp_path / "d.jsonl", ROWS)
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "data": {"path": str(data), "template": "compact"},
                "output_dir": str(out),
                "seq_len": 64,
                "micro_batch": 2,
                "max_steps": 2,
                "save_steps": 1,
                "precision": "fp32",
            }
        )
    )

    def disk_fills(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"half a file")
        raise failure

    monkeypatch.setattr(peft.peft_model, "safe_save_file", disk_fills)
    rc, err = run_cli(["train", "--config", str(config), "--quiet"], capsys)

    assert rc == 2, err
    (line,) = err.splitlines()
    reason = "No space left on device" if "28" in str(failure) else failure.strerror
    assert line.startswith(f"tunelab train: error: {out / 'adapter'}: {reason} while writing it; "), line
    # LoRA r 16 on every linear layer of 2 blocks (hidden 64, kv 32, MLP 128), fp32: 16 * (in + out) each
    lora_bytes = 4 * 2 * 16 * ((64 + 64) + (64 + 32) * 2 + (64 + 64) + (64 + 128) * 3)
    assert f"needs {lora_bytes:,} bytes" in line
    assert "resume: true (checkpoint step-0000001 is untouched)" in line
    (step,) = checkpoint.list_checkpoints(out / "checkpoints")
    assert checkpoint.verify(step) is None
    assert sorted(p.name for p in out.iterdir()) == [".tunelab.lock", "checkpoints", "config.yaml", "metrics.jsonl"]


def test_a_full_disk_at_a_best_save_is_one_line_and_leaves_no_best(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """The first best/ save (after the first evaluation) fails half-way: one line, no best/ and no temp dir."""
    import peft.peft_model

    out = tmp_path / "run"
    data = write_jsonl(tmp_path / "d.jsonl", [*ROWS, *ROWS])
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "data": {"path": str(data), "template": "compact"},
                "eval": {"split": 0.25, "steps": 1},
                "output_dir": str(out),
                "seq_len": 64,
                "micro_batch": 2,
                "max_steps": 2,
                "precision": "fp32",
            }
        )
    )

    def disk_fills(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(peft.peft_model, "safe_save_file", disk_fills)
    rc, err = run_cli(["train", "--config", str(config), "--quiet"], capsys)

    assert rc == 2, err
    (line,) = err.splitlines()
    assert line.startswith(f"tunelab train: error: {out / 'best'}: No space left on device while writing it; "), line
    assert not (out / "best").exists() and not [p for p in out.iterdir() if p.name.startswith(".tmp")]
