"""Profile one training step of Hugging Face decoders on a CUDA device: every kernel's GPU time and
every op's host time, the inputs a per-kernel max(GPU, host) step-time model needs.

Run on a machine with one CUDA GPU and torch, transformers and peft installed::

    python validation/device_profile.py --out profile.jsonl

Each case builds a randomly initialised ``AutoModelForCausalLM`` from a preset's config in
``service/catalog/models.toml`` with fewer layers (``layers``), on the GPU, runs two warm-up steps
(forward with ``labels = input_ids``, backward, fused AdamW step) and then profiles one step with
``torch.profiler`` (CPU and CUDA activities). One JSON line per case: the step's wall time
unprofiled (median of three, synchronised), and per profiler key (an aten op or a CUDA kernel) its
count, self CPU time and self device time (microseconds). Imports nothing from ``service``.

Measured once on the H200 of validation/data/device_runs.json (2026-12-04), written to
``validation/data/device_profile.jsonl``, which ``validation/host_issue.py`` reads for the host time per
op of ``tuning.toml [host_issue]``. What it shows: the aten ops' own
host time is ~5 us each and a kernel launch ~6 us (the profiler's self CPU, Python's module overhead
excluded); most kernels of a small step run under 30 us (628 of 682 at llama-3.2-1b's 4 layers, 512
tokens; 368 of 585 with LoRA at 8B, 2 x 2048 tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES: list[dict[str, Any]] = [
    dict(id="llama1b-l4-full-bf16-mbs1-s512", preset="llama-3.2-1b", layers=4, mbs=1, seq=512, lora=False),
    dict(id="llama1b-l4-full-bf16-mbs4-s2048", preset="llama-3.2-1b", layers=4, mbs=4, seq=2048, lora=False),
    dict(id="llama8b-l2-full-bf16-mbs1-s4096", preset="llama-3.1-8b", layers=2, mbs=1, seq=4096, lora=False),
    dict(id="llama8b-l2-lora-bf16-mbs2-s2048", preset="llama-3.1-8b", layers=2, mbs=2, seq=2048, lora=True),
]


def build(case: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(tomllib.loads((ROOT / "service/catalog/models.toml").read_text())[case["preset"]]["config"])
    model_type = config.pop("model_type")
    config.update(num_hidden_layers=case["layers"], use_cache=False, attention_dropout=0.0)
    dtype = torch.bfloat16 if case["lora"] else torch.float32
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(model_type, **config), dtype=dtype, attn_implementation="sdpa"
        )
    model.train()
    if case["lora"]:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
        )
    return model


def run(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = build(case)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (case["mbs"], case["seq"]), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = []
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "self_cuda_time_total", 0.0)
        events.append(
            {
                "key": e.key,
                "count": e.count,
                "self_cpu_us": e.self_cpu_time_total,
                "self_device_us": device_us,
            }
        )
    return {"case": case, "step_s": statistics.median(times[2:]), "events": events}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for case in CASES:
        started = time.perf_counter()
        try:
            result = run(case)
        except Exception as error:
            result = {"case": case, "error": repr(error)[:2000]}
        with open(args.out, "a") as handle:
            handle.write(json.dumps(result) + "\n")
        print(
            case["id"],
            "error" if "error" in result else "ok",
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        import torch

        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
