"""tunelab's GGUF export against llama.cpp's own converter (convert_hf_to_gguf.py), tensor by tensor and key by key,
on tiny random models of each family with the embedded SmolLM2 tokenizer: for the families that transformers' GGUF
loader cannot read back (gpt-oss, Mixtral, OLMoE), the check that the file is the one llama.cpp would write.

    PYTHONPATH=src python benchmarks/scripts/gguf_converter_diff.py --llama-cpp DIR [--families gpt_oss,...] > out.json

DIR is a llama.cpp source tree (its convert_hf_to_gguf.py and gguf-py/); the llama-cpp-python sdist carries one
under vendor/llama.cpp (`pip download --no-deps --no-binary :all: llama-cpp-python`). Only the converter's Python
runs: nothing is compiled. `general.name` and `general.size_label` are left out of the comparison (names).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
FAMILIES = {  # every layer sparse and each family's own top-k normalisation, as llama.cpp's graphs assume
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=8),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    "qwen2_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
    ),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, tie_word_embeddings=False),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, intermediate_size=32),
    "llama": dict(intermediate_size=128),
}
SKIP_KEYS = {"general.name", "general.size_label"}


def tiny(model_type: str, folder: Path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tunelab import sources

    tokenizer = sources.load_tokenizer(sources.resolve("embedded"))
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        max_position_embeddings=256,
        initializer_range=0.2,
        **SHAPE,
        **FAMILIES[model_type],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def fields(reader) -> dict:
    out = {}
    for key, field in reader.fields.items():
        if key in SKIP_KEYS or key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001 - a field gguf cannot decode is compared by its raw parts
            out[key] = [bytes(p).hex() for p in field.parts]
    return out


def compare(model_type: str, llama_cpp: Path, work: Path) -> dict:
    import gguf
    import numpy as np

    from tunelab.model import gguf_export as ge

    folder = work / model_type
    model = tiny(model_type, folder)
    theirs, ours = work / f"{model_type}-llamacpp.gguf", work / f"{model_type}-tunelab.gguf"
    path = [str(llama_cpp / "gguf-py"), *filter(None, [os.environ.get("PYTHONPATH")])]  # sentencepiece for Llama's
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    run = subprocess.run(
        [
            sys.executable,
            str(llama_cpp / "convert_hf_to_gguf.py"),
            str(folder),
            "--outfile",
            str(theirs),
            "--outtype",
            "f32",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if run.returncode:
        return {"family": model_type, "error": run.stderr.strip().splitlines()[-1:]}
    ge.write_model(model, folder, ge.check_model(model.config, folder, "f32", model_type), ours, "tiny")
    a, b = gguf.GGUFReader(theirs), gguf.GGUFReader(ours)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    differing = [
        n
        for n in sorted(set(ta) & set(tb))
        if list(ta[n].shape) != list(tb[n].shape)
        or ta[n].tensor_type != tb[n].tensor_type
        or not np.array_equal(ta[n].data, tb[n].data)
    ]
    fa, fb = fields(a), fields(b)
    return {
        "family": model_type,
        "tensors": len(ta),
        "tensors_only_llamacpp": sorted(set(ta) - set(tb)),
        "tensors_only_tunelab": sorted(set(tb) - set(ta)),
        "tensors_differing": differing,
        "keys": len(fa),
        "keys_only_llamacpp": sorted(set(fa) - set(fb)),
        "keys_only_tunelab": sorted(set(fb) - set(fa)),
        "keys_differing": sorted(k for k in set(fa) & set(fb) if fa[k] != fb[k]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = [compare(f, args.llama_cpp, Path(work)) for f in args.families.split(",")]
    print(json.dumps({"llama_cpp": str(args.llama_cpp), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
