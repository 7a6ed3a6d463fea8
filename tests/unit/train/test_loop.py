"""`tunelab train` end to end on a tiny random Llama (built in code, saved as a local HF dir)."""

import json

import pytest
import torch
from conftest import compile_without_inductor, write_jsonl
from conftest import tiny_train_config as config

from tunelab.cli import main
from tunelab.config import load_config
from tunelab.errors import TunelabError
from tunelab.recipes.finetune import finetune
from tunelab.train.loop import Measurement

pytestmark = pytest.mark.slow  # every test here trains or compiles


@pytest.fixture
def data_file(tmp_path, addition_rows):
    return write_jsonl(tmp_path / "add.jsonl", addition_rows)


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_lora_run_writes_every_output(tiny_model_dir, data_file, tmp_path):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            str(_yaml(tmp_path)),
            f"model={tiny_model_dir}",
            f"data.path={data_file}",
            f"output_dir={out}",
            "max_steps=4",
            "log_steps=2",
            "micro_batch=4",
            "seq_len=64",
            "--quiet",
        ]
    )
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {"adapter", "metrics.jsonl", "summary.json", "config.yaml"}
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp")]
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [2, 4]
    for key in (
        "loss",
        "lr",
        "tokens_padded",
        "tokens_nonpad",
        "tokens_loss",
        "elapsed_s",
        "tokens_nonpad_per_s",
        "peak_memory_bytes",
    ):
        assert key in metrics[-1]
    # The counters are the sums of what the first 4 steps' batches feed: every position of the packed rows,
    # the non-padding ones, and the response tokens scored.
    from tunelab.recipes.finetune import prepare_run

    prep = prepare_run(load_config(out / "config.yaml"))
    fed = [b for _, step in prep.schedule.iterate(0, 4) for b in step]
    expected = {
        "tokens_padded": sum(b.input_ids.size for b in fed),
        "tokens_nonpad": sum(b.tokens_nonpad for b in fed),
        "tokens_loss": sum(b.tokens_loss for b in fed),
    }
    assert {k: metrics[-1][k] for k in expected} == expected
    assert expected["tokens_padded"] == 4 * 4 * 64  # packed: 4 steps x micro_batch 4 x seq_len 64
    assert expected["tokens_padded"] > expected["tokens_nonpad"] > expected["tokens_loss"]
    # Each log reports its own window: the tokens fed since the last log over the seconds since then
    # (the steady window starts right after the step-2 log).
    fed_in_window = metrics[1]["tokens_nonpad"] - metrics[0]["tokens_nonpad"]
    window_s = fed_in_window / metrics[1]["tokens_nonpad_per_s"]
    assert window_s == pytest.approx(metrics[1]["elapsed_s"] - metrics[0]["elapsed_s"], rel=0.1, abs=0.02)
    first_s = metrics[0]["tokens_nonpad"] / metrics[0]["tokens_nonpad_per_s"]
    assert first_s == pytest.approx(metrics[0]["elapsed_s"], rel=0.1, abs=0.02)
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in expected} == expected
    assert summary["steps"] == 4 and summary["finished"] and summary["params_trainable"] < summary["params_total"]
    assert load_config(out / "config.yaml").batch.max_steps == 4
    # compile: auto (the default) decided, without a probe, that 4 tiny steps cannot pay for compiling
    assert summary["compile"]["mode"] == "auto" and summary["compile"]["chosen"] is False
    assert "eager blocks on cpu" in summary["compile"]["why"] and summary["activation_offload"] is False

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / "adapter")
    assert any("lora_A" in n for n, _ in tuned.named_parameters())


def _yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("method: lora\ndata:\n  template: compact\nprecision: fp32\n")
    return path


# Eager: compiled training's losses are checked step by step against a reference loop
# (test_reference_loop.py), and compiled dropout's backward in test_lora_linear.py.
@pytest.mark.parametrize("extra", [[], ["lora.dropout=0.1", "precision=bf16"]], ids=["plain", "dropout-bf16"])
def test_loss_goes_down(tiny_model_dir, data_file, tmp_path, extra):
    summary = finetune(
        config(tiny_model_dir, data_file, tmp_path / "r", "max_steps=16", "lr=3e-2", *extra), show_progress=False
    )
    assert summary["loss_last"] < summary["loss_first"] - 0.3


def test_a_run_shorter_than_the_warm_up_reports_its_whole_run_and_logs_the_rate_each_step_used(
    tiny_model_dir, data_file, tmp_path
):
    """Two steps, both warm-up: the rates cover both (never a measured-looking 0), and the logged lr is the one the
    step trained at (linear decay from 1e-2 without warm-up: 1e-2, then 5e-3), not the next step's."""
    out = tmp_path / "short"
    extra = ("max_steps=2", "lr_scheduler=linear", "warmup_ratio=0")
    summary = finetune(config(tiny_model_dir, data_file, out, *extra), show_progress=False)
    assert summary["rate_window"] == "all steps" and summary["steady_window_steps"] == 2
    assert summary["tokens_nonpad_per_s"] == pytest.approx(summary["tokens_nonpad"] / summary["steady_window_s"])
    assert 0 < summary["steady_window_s"] <= summary["train_s"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["lr"] for m in logged if "loss" in m] == pytest.approx([1e-2, 5e-3])
    longer = finetune(config(tiny_model_dir, data_file, tmp_path / "longer", "max_steps=3"), show_progress=False)
    assert longer["rate_window"] == "steady" and longer["steady_window_steps"] == 1


@pytest.mark.parametrize("method", ["dora", "full", "qlora"])
def test_other_methods_train(tiny_model_dir, data_file, tmp_path, method):
    extra = ["precision=bf16"] if method == "qlora" else []
    summary = finetune(
        config(tiny_model_dir, data_file, tmp_path / method, f"method={method}", "max_steps=6", *extra),
        show_progress=False,
    )
    assert summary["loss_last"] < summary["loss_first"]
    kind = "model" if method == "full" else "adapter"
    assert (tmp_path / method / kind).is_dir()
    if method == "full":
        assert summary["params_trainable"] == summary["params_total"]


@pytest.mark.parametrize("offload", [False, True])
def test_grad_checkpointing_gives_the_same_losses(tiny_model_dir, data_file, tmp_path, offload):
    """With activation_offload on a CPU the run checkpoints as without it (the tensors already are in host
    memory): the same losses, and the summary says it was on."""
    plain = finetune(config(tiny_model_dir, data_file, tmp_path / "a", "max_steps=3"), show_progress=False)
    ckpt = finetune(
        config(
            tiny_model_dir, data_file, tmp_path / "b", "max_steps=3", "grad_ckpt=true", f"activation_offload={offload}"
        ),
        show_progress=False,
    )
    assert read_metrics(tmp_path / "b")[-1]["loss"] == pytest.approx(read_metrics(tmp_path / "a")[-1]["loss"], rel=1e-5)
    assert ckpt["steps"] == plain["steps"] == 3
    assert ckpt["activation_offload"] is offload


def test_resume_reproduces_the_uninterrupted_run(tiny_model_dir, data_file, tmp_path):
    """Interrupted at step 4 (checkpoint at 4), resumed to 8: the loss curve matches an uninterrupted run."""
    full = tmp_path / "full"
    finetune(config(tiny_model_dir, data_file, full, "max_steps=8", "lora.dropout=0.1"), show_progress=False)
    cut = tmp_path / "cut"
    finetune(
        config(tiny_model_dir, data_file, cut, "max_steps=8", "save_steps=4", "lora.dropout=0.1"),
        show_progress=False,
        measure=Measurement(stop_at=6),
    )  # dies at step 6, after the checkpoint at 4
    assert not (cut / "adapter").exists()  # an unfinished run leaves no final adapter
    resumed = finetune(
        config(tiny_model_dir, data_file, cut, "max_steps=8", "save_steps=4", "lora.dropout=0.1", "resume=true"),
        show_progress=False,
    )
    expected = [(m["step"], m["loss"]) for m in read_metrics(full)]
    got = [(m["step"], m["loss"]) for m in read_metrics(cut)]
    assert [s for s, _ in got] == list(range(1, 9))
    assert [l for _, l in got] == pytest.approx([l for _, l in expected], rel=1e-6)
    assert resumed["loss_first"] == got[0][1]  # the run's first loss, logged before the interruption


def test_resume_with_a_smaller_micro_batch_and_the_same_rows_per_step_reproduces_the_run(
    tiny_model_dir, data_file, tmp_path
):
    """What the out-of-memory line offers: resume from the last checkpoint at micro_batch 2 x grad_accum 4
    instead of 4 x 2; each optimizer step sums the same rows, so the losses are an uninterrupted run's."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    finetune(
        config(tiny_model_dir, data_file, full, "max_steps=6", "micro_batch=4", "grad_accum=2"), show_progress=False
    )
    shape = ("max_steps=6", "save_steps=3")
    finetune(
        config(tiny_model_dir, data_file, cut, *shape, "micro_batch=4", "grad_accum=2"),
        show_progress=False,
        measure=Measurement(stop_at=4),
    )
    finetune(
        config(tiny_model_dir, data_file, cut, *shape, "micro_batch=2", "grad_accum=4", "resume=true"),
        show_progress=False,
    )
    expected = [(m["step"], m["loss"]) for m in read_metrics(full)]
    got = [(m["step"], m["loss"]) for m in read_metrics(cut)]
    assert [s for s, _ in got] == list(range(1, 7))
    assert [l for _, l in got] == pytest.approx([l for _, l in expected], rel=1e-6)


def test_a_new_run_refuses_an_output_dir_holding_an_earlier_runs_checkpoints(tiny_model_dir, data_file, tmp_path):
    """Otherwise its saves mix with the earlier run's: stopped after its own step-2, the earlier run's step-4
    would be the newest, and resume=true would continue that run under this one's settings."""
    out = tmp_path / "out"
    finetune(config(tiny_model_dir, data_file, out, "max_steps=6", "save_steps=2"), show_progress=False)
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    with pytest.raises(TunelabError, match=r"holds checkpoints of an earlier run \(newest step-0000004\); resume=true"):
        finetune(config(tiny_model_dir, data_file, out, "max_steps=4", "save_steps=2", "lr=1e-3"), show_progress=False)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before


def test_a_new_run_refuses_an_output_dir_holding_an_earlier_runs_best_weights(tiny_model_dir, data_file, tmp_path):
    """A run without evaluation never rewrites best/: the earlier run's would pass for this one's."""
    out = tmp_path / "out"
    (out / "best").mkdir(parents=True)
    (out / "best" / "tunelab_best.json").write_text('{"step": 6, "eval_loss": 0.7}')
    with pytest.raises(TunelabError, match=r"holds best/, the best weights of an earlier run"):
        finetune(config(tiny_model_dir, data_file, out, "max_steps=1"), show_progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["best"]


def test_resume_skips_a_truncated_latest_checkpoint(tiny_model_dir, data_file, tmp_path, capsys):
    out = tmp_path / "cut"
    finetune(
        config(tiny_model_dir, data_file, out, "max_steps=8", "save_steps=2"),
        show_progress=False,
        measure=Measurement(stop_at=6),
    )
    previous, latest = sorted((out / "checkpoints").iterdir())
    weights = latest / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # as a crash or a full disk mid-write would leave it
    capsys.readouterr()
    summary = finetune(config(tiny_model_dir, data_file, out, "max_steps=8", "save_steps=2", "resume=true"))
    printed = capsys.readouterr()
    assert f"checkpoint {latest} is incomplete or corrupt (trainable.safetensors has 100 bytes" in printed.err
    assert f"); resuming from {previous}\n" in printed.err
    assert f"resumed from {previous} at step 4" in printed.out
    assert previous.name == "step-0000004" and summary["steps"] == 8
    assert [m["step"] for m in read_metrics(out)] == list(range(1, 9))


def test_resume_true_without_a_checkpoint_says_it_starts_over(tiny_model_dir, data_file, tmp_path, capsys):
    out = tmp_path / "first"
    summary = finetune(config(tiny_model_dir, data_file, out, "max_steps=2", "resume=true"))
    assert f"resume: no checkpoint in {out / 'checkpoints'} yet; starting from step 0\n" in capsys.readouterr().out
    assert summary["steps"] == 2


def test_checkpoints_rotate(tiny_model_dir, data_file, tmp_path):
    out = tmp_path / "rot"
    finetune(
        config(tiny_model_dir, data_file, out, "max_steps=7", "save_steps=2", "save_total_limit=2"), show_progress=False
    )
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["step-0000004", "step-0000006"]


def test_unpacked_run(tiny_model_dir, data_file, tmp_path):
    summary = finetune(
        config(tiny_model_dir, data_file, tmp_path / "u", "max_steps=3", "packing=false"), show_progress=False
    )
    assert summary["tokens_padded"] >= summary["tokens_nonpad"] and summary["steps"] == 3


def test_export_merge_matches_base_plus_adapter(tiny_model_dir, data_file, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    finetune(config(tiny_model_dir, data_file, out, "max_steps=3"), show_progress=False)
    assert main(["export", "--adapter", str(out / "adapter"), "--merge", "--out", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / "adapter")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, tuned(ids).logits, atol=1e-5)
    assert not any("lora" in n for n, _ in merged.named_parameters())


@pytest.mark.parametrize(
    "args, message",
    [
        (["data.path=/nonexistent.jsonl"], "data file not found"),
        (["data.format=completion", "data.template=alpaca"], "missing field 'prompt'"),
        (["seq_len=100000"], "over the model's limit"),
        (["output_dir=/proc/nope/out"], "cannot write there"),
        (["model=/nonexistent/model"], "not a local directory"),
        (["lora.targets=[nope_proj]"], "not found in the model"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tiny_model_dir, data_file, tmp_path, capsys, args, message):
    out = tmp_path / "never"
    base = [f"model={tiny_model_dir}", f"data.path={data_file}", f"output_dir={out}", "seq_len=64", "--quiet"]
    code = main(["train", "--config", str(_yaml(tmp_path)), *base, *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_demo_scores_each_kept_checkpoint(tiny_model_dir, data_file, tmp_path):
    """The demo's accuracy curve: every kept checkpoint is loaded into one model and scored."""
    from tunelab.commands.demo import score_checkpoints
    from tunelab.commands.eval import read_rows

    out = tmp_path / "run"
    cfg = config(tiny_model_dir, data_file, out, "max_steps=6", "save_steps=2", "save_total_limit=10")
    finetune(cfg, show_progress=False)
    rows = read_rows(data_file, "alpaca", 8)
    results = score_checkpoints(cfg, rows, out / "checkpoints")
    assert [state.step for state, _ in results] == [2, 4]
    assert [state.elapsed_s > 0 for state, _ in results] == [True, True]
    assert all(0.0 <= accuracy <= 1.0 for _, accuracy in results)


def test_compiled_blocks_save_less_for_backward_than_at_full_budget(tokenizer, monkeypatch):
    """compile_blocks lowers the partitioner's activation memory budget: a compiled block then keeps fewer
    bytes for backward (it recomputes cheap element-wise results) than at a budget of 1.0."""
    import torch._functorch.config as aot_config
    from conftest import make_tiny_llama

    from tunelab.recipes import finetune as command

    monkeypatch.setattr(aot_config, "activation_memory_budget", aot_config.activation_memory_budget)  # restored after
    compile_without_inductor(monkeypatch, "aot_eager_decomp_partition")  # what is saved is the partitioner's choice
    ids = torch.randint(3, len(tokenizer), (4, 64), generator=torch.Generator().manual_seed(0))

    def saved_bytes(budget: float) -> int:
        monkeypatch.setattr(command, "ACTIVATION_MEMORY_BUDGET", budget)
        torch._dynamo.reset()
        model = make_tiny_llama(len(tokenizer))
        command.compile_blocks(model)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved: dict[int, int] = {}

        def keep(t):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            model(ids).logits.float().square().mean().backward()
        return sum(n for ptr, n in saved.items() if ptr not in params)

    shipped = command.ACTIVATION_MEMORY_BUDGET
    assert shipped < 1.0
    try:
        assert saved_bytes(shipped) < saved_bytes(1.0)
    finally:
        torch._dynamo.reset()


def test_the_heap_is_frozen_while_the_loop_runs_and_released_after(tiny_model_dir, data_file, tmp_path):
    """Full collections during the steps would scan the model and the libraries; the loop freezes them and
    gives them back to the collector when it ends."""
    import gc

    seen = []

    def watch(phase, info):
        if phase == "start":
            seen.append(gc.get_freeze_count())

    assert gc.get_freeze_count() == 0
    gc.callbacks.append(watch)
    try:
        finetune(config(tiny_model_dir, data_file, tmp_path / "run", "max_steps=4"), show_progress=False)
    finally:
        gc.callbacks.remove(watch)
    frozen = [n for n in seen if n]
    # the model's parameters alone are hundreds of tracked objects
    assert frozen and min(frozen) > 1000, (len(seen), frozen[:5])
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("attention", ["flex", "slots"])
def test_a_compiled_run_compiles_nothing_after_its_first_steps(
    tiny_model_dir, data_file, tmp_path, monkeypatch, attention
):
    """`compile: true` through the whole loop (LoRA, packed rows of varying document mixes, a short last step,
    evaluation in between, a small evaluation set): dynamo builds the training graphs in the first
    micro-batch and the no-grad ones in the first evaluation, and none after that. A recompile on CUDA costs
    ~16 s; on CPU, a flex evaluation batch with fewer rows than training's made the batch size dynamic and
    inductor's CPU flex kernel failed to compile. Dynamo's guards decide what recompiles, so the blocks
    compile with the aot_eager backend (seconds instead of an inductor build)."""
    from torch._dynamo.utils import counters

    from tunelab.train import loop

    compile_without_inductor(monkeypatch)

    graphs: list[tuple[bool, int]] = []
    evaluating = [False]
    real_forward, real_evaluate = loop.forward, loop.eval_loss

    def counting_forward(model, batch, device):
        out = real_forward(model, batch, device)
        if not evaluating[0]:
            graphs.append((True, counters["stats"]["unique_graphs"]))
        return out

    def counting_evaluate(*args, **kwargs):
        evaluating[0] = True
        try:
            out = real_evaluate(*args, **kwargs)
        finally:
            evaluating[0] = False
        graphs.append((False, counters["stats"]["unique_graphs"]))
        return out

    monkeypatch.setattr(loop, "forward", counting_forward)
    monkeypatch.setattr(loop, "eval_loss", counting_evaluate)
    torch._dynamo.reset()
    counters.clear()
    try:
        cfg = config(
            tiny_model_dir,
            data_file,
            tmp_path / "run",
            "compile=true",
            f"attention={attention}",
            "max_steps=8",
            "eval.split=0.1",
            "eval.steps=3",
        )
        finetune(cfg, show_progress=False)
    finally:
        torch._dynamo.reset()
    # 15 micro-batches (7.5 steps of grad_accum 2 in the epoch), evaluations after steps 3, 6 and the last
    assert [t for t, _ in graphs].count(True) == 15 and [t for t, _ in graphs].count(False) == 3, graphs
    first_eval = [t for t, _ in graphs].index(False)
    assert graphs[0][1] > 0 and {n for _, n in graphs[:first_eval]} == {graphs[0][1]}, graphs
    assert {n for _, n in graphs[first_eval:]} == {graphs[first_eval][1]}, graphs


class FakeClock:
    """The loop's `time` module with a clock that moves only inside an optimizer step: each "takes" `step_s`."""

    def __init__(self, monkeypatch, step_s: float):
        from tunelab.train import loop

        self.now = 1000.0
        real_step = loop._optimizer_step

        def timed_step(*args):
            lr = real_step(*args)
            self.now += step_s
            return lr

        monkeypatch.setattr(loop, "time", self)
        monkeypatch.setattr(loop, "_optimizer_step", timed_step)

    def perf_counter(self) -> float:
        return self.now


def test_max_minutes_ends_the_run_after_the_last_step_that_fits_and_saves_it(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    FakeClock(monkeypatch, 60.0)
    out = tmp_path / "run"
    summary = finetune(config(tiny_model_dir, data_file, out, "max_steps=8", "log_steps=5", "max_minutes=3.5"))
    # 60 s a step: after step 3 (180 s) a fourth would end at 240 s, past 210.
    assert summary["steps"] == 3 and summary["total_steps"] == 8
    assert summary["time_limited"] and summary["finished"] and not summary["early_stopped"]
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert [m["step"] for m in read_metrics(out)] == [3]  # the last step's window is logged
    assert "time limit: max_minutes 3.5 ended training after step 3 of 8" in capsys.readouterr().out


def test_max_minutes_counts_the_training_time_before_a_resume(tiny_model_dir, data_file, tmp_path, monkeypatch):
    FakeClock(monkeypatch, 60.0)
    out = tmp_path / "run"
    args = (tiny_model_dir, data_file, out, "max_steps=8", "save_steps=2", "max_minutes=3.5")
    finetune(config(*args), show_progress=False, measure=Measurement(stop_at=2))
    resumed = finetune(config(*args, "resume=true"), show_progress=False)
    # 120 s before the resume: one more step fits (180 s), a second would end at 240 s.
    assert resumed["steps"] == 3 and resumed["time_limited"]


def _lrs(out) -> list[float]:
    return [m["lr"] for m in read_metrics(out)]


def test_a_schedule_fitted_to_max_minutes_decays_to_its_end_within_the_limit(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    """60 s a step, 6.5 min: after the two warm-up steps and one steady step (180 s), three more fit. The fitted
    run ends there as a finished run with its learning rate decayed; the same limit without the fit cuts the
    20-step schedule near its peak."""
    FakeClock(monkeypatch, 60.0)
    fitted, cut = tmp_path / "fitted", tmp_path / "cut"
    args = ("max_steps=20", "log_steps=1", "max_minutes=6.5", "lr_scheduler=cosine", "warmup_ratio=0")
    summary = finetune(config(tiny_model_dir, data_file, fitted, *args, "schedule_within_limit=true"))
    assert summary["steps"] == 6 and summary["schedule_steps"] == 6 and summary["total_steps"] == 20
    assert summary["finished"] and not summary["time_limited"]
    assert (fitted / "adapter" / "adapter_model.safetensors").is_file()
    printed = capsys.readouterr().out
    assert "max_minutes 6.5 holds 6 of the 20 steps; the learning-rate schedule now ends at step 6" in printed
    assert "step 6/6 |" in printed and [m["total_steps"] for m in read_metrics(fitted)][-1] == 6
    plain = finetune(config(tiny_model_dir, data_file, cut, *args), show_progress=False)
    assert plain["steps"] == 6 and plain["time_limited"] and plain["schedule_steps"] is None
    peak = _lrs(cut)[0]
    # Cosine over 6 steps from step 3 on: the last step's rate is a small share of the peak; cut, most of it.
    assert _lrs(fitted)[-1] < 0.1 * peak < 0.5 * peak < _lrs(cut)[-1]
    assert _lrs(fitted)[:3] == _lrs(cut)[:3]


def test_a_resumed_run_keeps_its_fitted_schedule(tiny_model_dir, data_file, tmp_path, monkeypatch):
    FakeClock(monkeypatch, 60.0)
    out = tmp_path / "run"
    args = (tiny_model_dir, data_file, out, "max_steps=20", "save_steps=4", "max_minutes=6.5")
    args += ("schedule_within_limit=true", "log_steps=1")
    finetune(config(*args), show_progress=False, measure=Measurement(stop_at=4))
    resumed = finetune(config(*args, "resume=true"), show_progress=False)
    assert resumed["steps"] == 6 and resumed["schedule_steps"] == 6 and resumed["finished"]
    whole = tmp_path / "whole"
    finetune(config(tiny_model_dir, data_file, whole, *args[3:]), show_progress=False)
    assert _lrs(out) == pytest.approx(_lrs(whole))


def test_schedule_within_limit_needs_max_minutes(tiny_model_dir, data_file, tmp_path):
    with pytest.raises(TunelabError, match=r"schedule_within_limit fits the schedule to max_minutes, which is not set"):
        config(tiny_model_dir, data_file, tmp_path / "bad", "schedule_within_limit=true")


def test_unlimited_runs_and_bad_limits(tiny_model_dir, data_file, tmp_path):
    summary = finetune(config(tiny_model_dir, data_file, tmp_path / "run", "max_steps=2"), show_progress=False)
    assert summary["steps"] == 2 and not summary["time_limited"]
    with pytest.raises(TunelabError, match=r"max_minutes must be 0 \(no limit\) or a positive number"):
        config(tiny_model_dir, data_file, tmp_path / "bad", "max_minutes=-1")
    with pytest.raises(TunelabError, match=r"max_minutes must be a finite number"):
        config(tiny_model_dir, data_file, tmp_path / "bad", "max_minutes=inf")
