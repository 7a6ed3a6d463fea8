"""`tunelab serve` on the embedded SmolLM2-135M with two adapters, through the official `openai` client: one server
for the module (started in this process on a free port), small max_tokens."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tunelab.cli import main

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration

KEY = "test-key"
QUESTION = "What is the capital of France?"
TOKENS = 12


def random_adapter(folder, rank: int, seed: int):
    """A LoRA adapter in PEFT's format on the embedded model's q_proj layers, with random A and B: a cheap stand-in
    for a trained one that changes the model's answers."""
    from safetensors.torch import save_file

    from tunelab.sources import model_config, resolve

    config = model_config(resolve("embedded"))
    hidden, layers = config.hidden_size, config.num_hidden_layers
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for i in range(layers):
        key = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        weights[f"{key}.lora_A.weight"] = torch.randn(rank, hidden, generator=generator) / hidden**0.5
        weights[f"{key}.lora_B.weight"] = torch.randn(hidden, rank, generator=generator) * 4
    folder.mkdir(parents=True)
    save_file(weights, folder / "adapter_model.safetensors")
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": ["q_proj"],
        "lora_dropout": 0.0,
        "bias": "none",
        "base_model_name_or_path": "embedded",
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import uvicorn

    from tunelab.device import pick_device, pick_precision
    from tunelab.serve.app import build_app
    from tunelab.serve.pool import ModelPool

    root = tmp_path_factory.mktemp("serve")
    adapters = {"one": str(random_adapter(root / "one", 4, 1)), "two": str(random_adapter(root / "two", 8, 2))}
    device = pick_device("auto")
    pool = ModelPool("embedded", adapters, device, pick_precision("auto", device))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = build_app(pool, KEY, batch_size=16, max_tokens=TOKENS)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield {"url": f"http://127.0.0.1:{port}/v1", "root": root, "adapters": adapters, "engine": app.state.engine}
    server.should_exit = True
    thread.join(timeout=30)


def client(server, key=KEY):
    return openai.OpenAI(base_url=server["url"], api_key=key, max_retries=0)


def chat(server, model, **kwargs):
    messages = [{"role": "user", "content": QUESTION}]
    return client(server).chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=TOKENS, **kwargs
    )


def eval_answer(server, capsys, adapter: str) -> str:
    """`tunelab eval`'s greedy response to QUESTION with `adapter` (chat format: the model's chat template)."""
    data = server["root"] / "q.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": QUESTION}], "answer": "0"}) + "\n")
    out = server["root"] / f"pred-{adapter.rsplit('/', 1)[-1]}.jsonl"
    args = ["eval", "--data", str(data), "--adapter", adapter, "--model", "embedded", "--format", "chat"]
    assert main([*args, "--max-new-tokens", str(TOKENS), "--predictions", str(out), "--json"]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())["response"]


def test_models_list_and_answers_per_adapter(server, capsys):
    names = [m.id for m in client(server).models.list().data]
    assert names == ["embedded", "one", "two"]
    answers = {name: chat(server, name) for name in names}
    for reply in answers.values():
        assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens >= 1 and reply.usage.total_tokens > reply.usage.prompt_tokens
    texts = {name: r.choices[0].message.content for name, r in answers.items()}
    assert len(set(texts.values())) == 3, texts  # each adapter answers with its own weights, the base without
    # The served greedy answer is `tunelab eval`'s for the same prompt and adapter.
    assert texts["one"] == eval_answer(server, capsys, server["adapters"]["one"])


def test_stream_concatenates_to_the_answer(server):
    whole = chat(server, "two").choices[0].message.content
    stream = chat(server, "two", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_concurrent_requests_all_answered(server):
    prompts = [f"Count to {k}:" for k in range(6)]

    def complete(prompt):
        return client(server).completions.create(model="one", prompt=prompt, max_tokens=4, temperature=0)

    with ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(complete, prompts))
    assert all(r.object == "text_completion" and r.choices[0].text for r in replies)
    alone = complete(prompts[3]).choices[0].text
    assert replies[3].choices[0].text == alone  # batched with others, the same greedy answer


def test_errors_are_openai_shaped(server):
    with pytest.raises(openai.AuthenticationError):
        client(server, key="wrong").models.list()
    with pytest.raises(openai.NotFoundError) as missing:
        chat(server, "three")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as long:
        client(server).completions.create(model="one", prompt="hi " * 9000, max_tokens=4)
    assert long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as bad:
        chat(server, "one", n=0)
    assert bad.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as unsupported:  # refused, never silently ignored
        chat(server, "one", logprobs=True)
    assert unsupported.value.body["param"] == "logprobs"


def test_a_client_gone_mid_stream_frees_its_row(server):
    engine = server["engine"]
    before = engine.rows_cancelled
    messages = [{"role": "user", "content": "Tell me a long story."}]
    stream = client(server).chat.completions.create(
        model="embedded", messages=messages, temperature=0, max_tokens=400, stream=True
    )
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 20
    while engine.rows_cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.rows_cancelled > before  # ended at a step, long before its 400 tokens
