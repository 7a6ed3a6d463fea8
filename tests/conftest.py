"""Shared fixtures: a tiny tokenizer and tiny random-init Llama models built in code (no downloads).

Tiers: unit tests (default) use these; `@pytest.mark.integration` tests use the embedded SmolLM2-135M;
`@pytest.mark.gpu` tests need CUDA and are skipped without it.
"""

from __future__ import annotations

import json
import os
import shutil
import string
import tempfile
from dataclasses import fields, replace
from pathlib import Path

import pytest

# A cache of compiled kernels of this run's own: inductor's shared cache outlives a checkout, and a kernel
# that another build or ISA setting left there aborted a compiled test in one (a fresh cache passed it).
_OWN_INDUCTOR_CACHE = None if "TORCHINDUCTOR_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="tunelab-inductor-")
if _OWN_INDUCTOR_CACHE:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _OWN_INDUCTOR_CACHE

import torch  # noqa: E402  (after the cache directory is chosen)

# Under pytest-xdist the workers share the machine's cores: each takes its share of threads, and so do the
# processes a test starts (OMP_NUM_THREADS), so that n workers never run more threads than there are cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    torch.set_num_threads(_threads)
    os.environ["OMP_NUM_THREADS"] = str(_threads)

REPO = Path(__file__).resolve().parents[1]

# The CPU probes at an eighth of their budget and a quarter of the copy's buffer: bench probes the CPU again after
# every point, and plan probes once per process, ~2.7 s each time at the full budget. The tests check what is done
# with the figures, not their precision; on this machine 0.25 s read the same matmul peak as 2 s (within 6%, one
# thread, bf16 and fp32) and 64 MiB the same copy bandwidth as 256 MiB.
import tunelab.probe  # noqa: E402

tunelab.probe.PROBE_SECONDS = 0.25
tunelab.probe.COPY_MIB = 64


def hub_http_library():
    """The HTTP library huggingface_hub itself uses (httpx under 1.x, httpx2 under 2.x), to build the responses
    its errors take: importing either by name fails to collect on hosts with the other hub version."""
    import importlib

    import huggingface_hub

    return importlib.import_module(type(huggingface_hub.get_session()).__module__.partition(".")[0])


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def reset_accelerate() -> None:
    """Forget Accelerate's process-wide settings (precision, CPU) so the next job in this process sets its own.

    Commands run one job per process; tests run many, so they reset between jobs (keeping the distributed
    state, which a launched test process needs)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)


@pytest.fixture(autouse=True)
def _fresh_accelerate():
    reset_accelerate()
    yield
    # And after: a module fixture of the next test file (a trained checkpoint, say) runs before that file's
    # first reset.
    reset_accelerate()


# pytest keeps the base temporary folders of the last 3 sessions and deletes older ones when a session ends,
# inside the time it reports: a whole suite's folder (1.7 GB, saved models and GGUF exports) took 15 s to delete
# on this machine's disk, all of it waiting on the disk, after the last test. The session's first step moves them
# aside and deletes them in the background instead, while the tests run (the same folders, by pytest's own rule).
_OLD_BASETEMPS = None


def pytest_sessionstart(session):
    global _OLD_BASETEMPS
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or factory._given_basetemp is not None:  # an xdist worker's, or --basetemp: nothing to do
        return
    import subprocess
    import uuid

    from _pytest.pathlib import LOCK_TIMEOUT, cleanup_candidates, ensure_deletable

    basetemp = factory.getbasetemp()
    root, keep = basetemp.parent, int(session.config.getini("tmp_path_retention_count"))
    dead_before = basetemp.stat().st_mtime - LOCK_TIMEOUT
    trash = Path(tempfile.gettempdir()) / f"tunelab-old-basetemps-{uuid.uuid4().hex[:8]}"
    for old in cleanup_candidates(root, "pytest-", keep):
        if old != basetemp and ensure_deletable(old, dead_before):
            trash.mkdir(exist_ok=True)
            try:
                old.rename(trash / old.name)
            except OSError:
                pass  # pytest's own cleanup at the end takes it
    if trash.is_dir():
        _OLD_BASETEMPS = subprocess.Popen(["rm", "-rf", str(trash)], start_new_session=True)


def pytest_sessionfinish(session, exitstatus):
    if _OWN_INDUCTOR_CACHE:
        shutil.rmtree(_OWN_INDUCTOR_CACHE, ignore_errors=True)


def pytest_unconfigure(config):
    if _OLD_BASETEMPS is not None:
        _OLD_BASETEMPS.wait()


# The test files that take longest, longest first (benchmarks/test-suite/make-test_xeon-amx-2c_2026-11-27.md). With
# `--dist loadfile --no-loadscope-reorder` (the Makefile's) pytest-xdist hands out whole files in collection
# order as workers free up; a long file handed out last ran on one worker while the other sat idle for a
# minute. Longest first, the short files fill in around them at the end.
LONGEST_FIRST = (
    "tests/unit/ui/test_browser.py",
    "tests/unit/train/test_reference_loop.py",
    "tests/integration/test_api.py",
    "tests/unit/plan/test_plan_memory_measured.py",
    "tests/unit/plan/test_plan_memory_saved.py",
    "tests/integration/test_methods.py",
    "tests/integration/test_gguf_embedded.py",
    "tests/unit/train/test_fsdp.py",
    "tests/unit/bench/test_suite.py",
    "tests/unit/recipes/test_preference_run.py",
    "tests/integration/test_peers_embedded.py",
    "tests/unit/train/test_kill.py",
    "tests/unit/model/test_families.py",
    "tests/unit/train/test_distributed.py",
    "tests/integration/test_eval_embedded.py",
    "tests/unit/train/test_loop.py",
    "tests/unit/bench/test_measure.py",
    "tests/unit/recipes/test_finetune.py",
)
_missing = [f for f in LONGEST_FIRST if not (REPO / f).is_file()]
assert not _missing, f"conftest.LONGEST_FIRST names files that are gone: {_missing}"


def pytest_collection_modifyitems(config, items):
    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    # A stable sort keeps each file's tests together and in their own order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def make_tokenizer():
    """Character-level fast tokenizer: every digit is its own token, as in SmolLM2/Llama-3 tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    chars = list(string.printable)
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHATML
    return fast


# The tiny decoder shape the unit tests share (any family's config takes these keys).
TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def make_tiny_llama(vocab_size: int, seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = dict(TINY_SHAPE, vocab_size=vocab_size, tie_word_embeddings=False)
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg))


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved tiny random Llama + tokenizer: a 'local HF model dir' for `model:`."""
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_train_config(model_dir, data_file, out, *extra):
    """A small training config over `model_dir` and `data_file`; `extra` overrides win (later keys replace)."""
    from tunelab.config import load_config

    return load_config(
        None,
        [
            f"model={model_dir}",
            f"data.path={data_file}",
            f"output_dir={out}",
            "data.template=compact",
            "seq_len=64",
            "micro_batch=4",
            "grad_accum=2",
            "log_steps=1",
            "lr=1e-2",
            "precision=fp32",
            *extra,
        ],
    )


def tiny_optimizer_run(steps: int = 2, seed: int = 0):
    """A Linear model with train/loop's AdamW and schedule after `steps` steps: all that a checkpoint holds."""
    from tunelab.config import OptimizerConfig
    from tunelab.train import loop, optim

    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    spec = OptimizerConfig(lr=1e-2)
    optimizer = optim.build_optimizer(model, spec, torch.device("cpu"))
    scheduler = loop.build_scheduler(optimizer, spec, total_steps=10)
    for _ in range(steps):
        model(torch.randn(3, 8)).square().mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def compile_without_inductor(monkeypatch, backend="aot_eager") -> None:
    """Make every `nn.Module.compile` (compile_blocks') use `backend` (a name or a backend function), for tests
    whose subject is decided before inductor builds anything: dynamo's graphs and guards (`aot_eager`), or what
    the partitioner saves for backward (`aot_eager_decomp_partition`). Seconds instead of an inductor build."""
    real_compile = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real_compile(self, backend=backend))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def addition_rows() -> list[dict]:
    return make_addition_rows()


def make_addition_rows() -> list[dict]:
    """64 three-digit additions, the same every call."""
    import random

    r = random.Random(0)
    rows = []
    for _ in range(64):
        a, b = r.randint(0, 999), r.randint(0, 999)
        rows.append({"instruction": f"{a} + {b}", "output": f"{a} + {b} = {a + b}", "answer": str(a + b)})
    return rows


def small_run_config(folder: Path, model_dir: Path, extra: str = "") -> Path:
    """`folder`/train.yaml over `model_dir` and `folder`/data.jsonl (make_addition_rows): a held-out split of
    10% evaluated every 2 steps, packed rows of 64, micro-batch 4 x grad_accum 2, fp32; `extra`: more YAML lines."""
    write_jsonl(folder / "data.jsonl", make_addition_rows())
    config = folder / "train.yaml"
    config.write_text(
        f"model: {model_dir}\ndata:\n  path: {folder / 'data.jsonl'}\n  template: compact\n"
        "eval:\n  split: 0.1\n  steps: 2\nseq_len: 64\nmicro_batch: 4\ngrad_accum: 2\nlog_steps: 1\n"
        f"lr: 1.0e-2\nprecision: fp32\n{extra}"
    )
    return config


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache of the test's own, downloads on; the offline flags that huggingface_hub
    and datasets read on import are restored afterwards (`--offline` sets them)."""
    import datasets.config
    import huggingface_hub.constants

    folder = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    return folder


class PlanSetup(tuple):
    """(job, layout): what plan/memory.py's and plan/comm.py's functions take, as `memory.breakdown(arch, *s)`.
    `s.but(...)` changes settings by their config keys (`method`, `micro_batch`, `grad_ckpt`, and `r`,
    `lora_dropout`, `compiled` for the adapter's and compute's) and the layout's own fields by name."""

    def __new__(cls, job, layout):
        return super().__new__(cls, (job, layout))

    @property
    def job(self):
        return self[0]

    @property
    def layout(self):
        return self[1]

    def but(self, **kw) -> "PlanSetup":
        from tunelab.config import published

        job, layout = self
        lora = {name: kw.pop(key) for key, name in (("r", "r"), ("lora_dropout", "dropout")) if key in kw}
        if lora:
            job = job.but(lora=replace(job.adapter.lora, **lora))
        if "compiled" in kw:
            kw["compile"] = kw.pop("compiled")
        own = {f.name for f in fields(layout)}  # `attention` is the layout's resolved path, not the setting
        settings = {k: kw.pop(k) for k in list(kw) if k in published() and k not in own}
        return PlanSetup(job.but(**settings) if settings else job, replace(layout, **kw))


def plan_setup(**kw) -> PlanSetup:
    """LoRA r 8 on q and v, micro-batch 2 of rows of 10 with 5 loss positions, eager, 16-bit compute."""
    from tunelab.config import AdapterConfig, BatchConfig, ComputeConfig, LoraConfig
    from tunelab.plan import memory
    from tunelab.plan.job import Job

    job = Job(
        adapter=AdapterConfig(lora=LoraConfig(r=8)),
        batch=BatchConfig(micro_batch=2),
        compute=ComputeConfig(compile=False),
    )
    layout = memory.Layout(compute_bytes=2, targets=("q_proj", "v_proj"), row_len=10, loss_rows=5, loss_chunk=2048)
    return PlanSetup(job, layout).but(**kw)


def packed_ids(rows: list[list[int]], vocab: int, width: int, seed: int = 0):
    """Random token ids of `width` a row and the positions of packed documents: each row's lengths restart the
    positions at 0, and the row's padded tail is one more run."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (len(rows), width), generator=generator)
    positions = []
    for row in rows:
        tail = width - sum(row)
        positions.append([p for n in row + ([tail] if tail else []) for p in range(n)])
    return ids, torch.tensor(positions)
