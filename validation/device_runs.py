"""Measure real peak memory and step time of small single-GPU training runs on a CUDA device.

Run on a machine with one CUDA GPU and torch, transformers and peft installed::

    python validation/device_runs.py --out runs.jsonl            # every case, each in its own process
    python validation/device_runs.py --case CASE_ID --out x.jsonl # one case

Each case builds a randomly initialised ``AutoModelForCausalLM`` from a preset's HF config in
``service/catalog/models.toml`` directly on the GPU (no download), trains it for a few steps on
random token ids (``labels = input_ids``, so HF's loss over full logits is in the graph) and
records, as one JSON line:

* ``peak_allocated_bytes``: ``torch.cuda.max_memory_allocated()`` over the whole process (model
  build, every step; what litgpt prints as 'Memory used'), the phase resets folded in;
* ``peak_reserved_bytes``: ``torch.cuda.max_memory_reserved()``, the caching allocator's peak;
* ``device_used_bytes``: the device's used memory (``cudaMemGetInfo`` total - free, the figure
  nvidia-smi shows; this process is the GPU's only one) at the end, plus the reserved memory
  released since the peak (none: nothing calls ``empty_cache``);
* ``context_bytes``: used memory after CUDA's initialisation, before the first tensor;
* per phase of a steady step (the third): ``fwd_bwd_peak_allocated_bytes`` (forward + backward)
  and ``optimizer_peak_allocated_bytes`` (``optimizer.step()`` alone, with the gradients alive),
  and ``steady_allocated_bytes`` (what stays allocated between steps);
* ``step_s``: the median wall time of the steps after two warm-ups (synchronised).

Cases run either through ``transformers.Trainer`` (``runner: trainer``: the tool users run, with
its default optimizer, whatever this transformers names it) or a plain loop (``runner: loop``)
that names the optimizer's implementation (``foreach`` / ``fused``) to isolate its temporaries.
Each case runs in a fresh process so that every statistic starts from zero.

This file imports nothing from ``service``: it runs where only torch is installed. The numbers it
wrote are committed in ``validation/data/device_runs.json`` with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# precision: "bf16" = fp32 weights under bf16 autocast (HF Trainer bf16=True); "bf16_pure" = weights,
# gradients and AdamW states in bf16; "fp32" / "tf32" = fp32 everything, tf32 with TF32 matmuls. LoRA:
# r 16, alpha 32, every decoder Linear, dropout 0.
def case(
    id: str, preset: str, runner: str, method: str, precision: str, mbs: int, seq: int, gc: bool, steps: int,
    **extra: str | int,
) -> dict[str, Any]:  # fmt: skip
    """One measured case (``gc``: gradient checkpointing); ``extra`` holds ``optim`` (the loop's AdamW
    implementation, foreach or fused), ``base_dtype`` (LoRA's frozen base: bf16, or fp32 under bf16
    autocast) and ``ga`` (gradient accumulation steps, default 1)."""
    fields = {"mbs": mbs, "seq": seq, "gc": gc, "steps": steps, **extra}
    return {"id": id, "preset": preset, "runner": runner, "method": method, "precision": precision, **fields}


# fmt: off
# id, preset, runner, method, precision, micro-batch, seq, gradient checkpointing, steps
CASES: list[dict[str, Any]] = [
    case("trainer-llama1b-full-bf16-mbs4-s2048", "llama-3.2-1b", "trainer", "full", "bf16",
         4, 2048, False, 8),
    case("trainer-llama1b-full-bf16-gc-mbs8-s2048", "llama-3.2-1b", "trainer", "full", "bf16",
         8, 2048, True, 8),
    case("loop-llama1b-full-bf16-foreach-mbs1-s512", "llama-3.2-1b", "loop", "full", "bf16",
         1, 512, False, 8, optim="foreach"),
    case("loop-llama1b-full-bf16-fused-mbs1-s512", "llama-3.2-1b", "loop", "full", "bf16",
         1, 512, False, 8, optim="fused"),
    case("loop-llama1b-full-bf16pure-foreach-mbs4-s2048", "llama-3.2-1b", "loop", "full", "bf16_pure",
         4, 2048, False, 8, optim="foreach"),
    case("trainer-llama8b-lora-bf16base-gc-mbs2-s2048", "llama-3.1-8b", "trainer", "lora", "bf16",
         2, 2048, True, 6, base_dtype="bf16"),
    case("trainer-llama8b-lora-fp32base-mbs1-s2048", "llama-3.1-8b", "trainer", "lora", "bf16",
         1, 2048, False, 6, base_dtype="fp32"),
    case("loop-qwen05b-full-tf32-fused-mbs4-s1024", "qwen2.5-0.5b", "loop", "full", "tf32",
         4, 1024, False, 8, optim="fused"),
    case("loop-qwen05b-full-fp32-fused-mbs4-s1024", "qwen2.5-0.5b", "loop", "full", "fp32",
         4, 1024, False, 8, optim="fused"),
    case("loop-llama8b-full-bf16pure-fused-gc-mbs1-s4096", "llama-3.1-8b", "loop", "full", "bf16_pure",
         1, 4096, True, 6, optim="fused"),
    case("trainer-qwen3-06b-full-bf16-mbs8-s1024", "qwen3-0.6b", "trainer", "full", "bf16",
         8, 1024, False, 8),
    case("loop-llama1b-full-bf16-foreach-gc-mbs16-s2048", "llama-3.2-1b", "loop", "full", "bf16",
         16, 2048, True, 6, optim="foreach"),
    case("loop-llama3b-lora-bf16base-foreach-mbs4-s4096", "llama-3.2-3b", "loop", "lora", "bf16",
         4, 4096, False, 6, base_dtype="bf16", optim="foreach"),
]

# The held-out half: chosen, and measured, after the cases above were compared with the estimator and
# before any change to it was made from that comparison; nothing is fitted on them.
HELD_OUT: list[dict[str, Any]] = [
    case("trainer-llama1b-full-bf16-ga2-mbs4-s1024", "llama-3.2-1b", "trainer", "full", "bf16",
         4, 1024, False, 6, ga=2),
    case("loop-qwen05b-full-bf16-foreach-mbs8-s1024", "qwen2.5-0.5b", "loop", "full", "bf16",
         8, 1024, False, 8, optim="foreach"),
    case("trainer-qwen7b-full-bf16pure-gc-mbs2-s2048", "qwen2.5-7b", "trainer", "full", "bf16_pure",
         2, 2048, True, 6),
    case("loop-llama3b-full-bf16-fused-mbs2-s2048", "llama-3.2-3b", "loop", "full", "bf16",
         2, 2048, False, 6, optim="fused"),
    case("trainer-llama8b-lora-bf16base-mbs4-s1024", "llama-3.1-8b", "trainer", "lora", "bf16",
         4, 1024, False, 6, base_dtype="bf16"),
    case("loop-smollm2-full-bf16pure-foreach-gc-mbs8-s2048", "smollm2-1.7b", "loop", "full", "bf16_pure",
         8, 2048, True, 6, optim="foreach"),
    case("loop-qwen3-06b-full-bf16-foreach-mbs1-s256", "qwen3-0.6b", "loop", "full", "bf16",
         1, 256, False, 10, optim="foreach"),
    case("loop-llama1b-full-bf16-fused-mbs2-s1024", "llama-3.2-1b", "loop", "full", "bf16",
         2, 1024, False, 8, optim="fused"),
    case("trainer-mistral7b-lora-bf16base-gc-mbs4-s4096", "mistral-7b", "trainer", "lora", "bf16",
         4, 4096, True, 6, base_dtype="bf16"),
    case("trainer-gemma3-1b-full-bf16-mbs4-s2048", "gemma-3-1b", "trainer", "full", "bf16",
         4, 2048, False, 6),
]
# fmt: on


def hf_config(preset: str) -> Any:
    from transformers import AutoConfig

    catalog = tomllib.loads((ROOT / "service/catalog/models.toml").read_text())
    config = dict(catalog[preset]["config"])
    model_type = config.pop("model_type")
    config.update(use_cache=False, attention_dropout=0.0)
    return AutoConfig.for_model(model_type, **config)


def build_model(case: dict[str, Any]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    weights_bf16 = case["precision"] == "bf16_pure" or case.get("base_dtype") == "bf16"
    dtype = torch.bfloat16 if weights_bf16 else torch.float32
    config = hf_config(case["preset"])
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        except TypeError:
            model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype, attn_implementation="sdpa")
    model.train()
    if case["gc"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case["method"] == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
        model = get_peft_model(model, lora)
    return model


def counts(model: Any) -> dict[str, int]:
    params = list(model.parameters())
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
    }


def fold_peaks(out: dict[str, Any]) -> None:
    """Fold the peaks since the last reset into the whole-run peaks (a phase reset clears them)."""
    import torch

    stats = torch.cuda.memory_stats()
    for key, stat in (
        ("peak_allocated_bytes", "allocated_bytes.all.peak"),
        ("peak_reserved_bytes", "reserved_bytes.all.peak"),
    ):
        out[key] = max(out.get(key, 0), stats[stat])


def run_loop(case: dict[str, Any], model: Any, out: dict[str, Any]) -> None:
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    kind = case["optim"]
    optimizer = torch.optim.AdamW(
        trainable, lr=1e-5, weight_decay=0.0, foreach=kind == "foreach", fused=kind == "fused"
    )
    autocast = case["precision"] == "bf16"
    ids = torch.randint(0, model.config.vocab_size, (case["mbs"], case["seq"]), device="cuda")
    times: list[float] = []
    for step in range(case["steps"]):
        torch.cuda.synchronize()
        started = time.perf_counter()
        if step == 2:
            out["steady_allocated_bytes"] = torch.cuda.memory_allocated()
            fold_peaks(out)
            torch.cuda.reset_peak_memory_stats()
        for _ in range(case.get("ga", 1)):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        if step == 2:
            torch.cuda.synchronize()
            out["fwd_bwd_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            out["grads_allocated_bytes"] = torch.cuda.memory_allocated()
            fold_peaks(out)
            torch.cuda.reset_peak_memory_stats()
        optimizer.step()
        if step == 2:
            torch.cuda.synchronize()
            out["optimizer_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        out["loss"] = float(loss)
    out["step_times_s"] = times


def run_trainer(case: dict[str, Any], model: Any, out: dict[str, Any]) -> None:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    times: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        started = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            torch.cuda.synchronize()
            Timer.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            torch.cuda.synchronize()
            times.append(time.perf_counter() - Timer.started)

    vocab = model.config.vocab_size
    rows = case["mbs"] * case.get("ga", 1) * case["steps"]
    ids = torch.randint(0, vocab, (rows, case["seq"]))
    data = [{"input_ids": ids[i], "labels": ids[i]} for i in range(rows)]
    args = TrainingArguments(
        output_dir="/tmp/trainer-out",
        per_device_train_batch_size=case["mbs"],
        gradient_accumulation_steps=case.get("ga", 1),
        max_steps=case["steps"],
        bf16=case["precision"] == "bf16",
        tf32=case["precision"] == "tf32",
        gradient_checkpointing=case["gc"],
        gradient_checkpointing_kwargs={"use_reentrant": False} if case["gc"] else None,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        learning_rate=1e-5,
    )
    out["trainer_optim"] = str(args.optim)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Timer()])
    trainer.train()
    out["step_times_s"] = times
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    out["loss"] = logs[-1]["loss"] if logs else None


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"case": case}
    if case["precision"] == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif case["precision"] == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.init()
    torch.empty(0, device="cuda")
    free, total = torch.cuda.mem_get_info()
    out["context_bytes"] = total - free
    out["total_bytes"] = total
    model = build_model(case)
    out.update(counts(model))
    out["model_allocated_bytes"] = torch.cuda.memory_allocated()
    if case["runner"] == "trainer":
        run_trainer(case, model, out)
    else:
        run_loop(case, model, out)
    torch.cuda.synchronize()
    fold_peaks(out)
    reserved_now = torch.cuda.memory_stats()["reserved_bytes.all.current"]
    out["reserved_now_bytes"] = reserved_now
    free, total = torch.cuda.mem_get_info()
    out["device_used_now_bytes"] = total - free
    out["device_used_bytes"] = total - free + out["peak_reserved_bytes"] - reserved_now
    try:  # nvidia-smi's per-process figure (MiB), where the driver reports processes
        smi = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
        out["nvidia_smi_process_mib"] = [line.strip() for line in smi.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        out["nvidia_smi_process_mib"] = None
    times = out["step_times_s"][2:] or out["step_times_s"]
    out["step_s"] = statistics.median(times)
    out["device"] = torch.cuda.get_device_name()
    out["torch"] = torch.__version__
    import transformers

    out["transformers"] = transformers.__version__
    try:
        import peft

        out["peft"] = peft.__version__
    except ImportError:
        out["peft"] = None
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case")
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--held-out", action="store_true", help="run the held-out cases")
    args = parser.parse_args()
    if args.case:
        case = next(c for c in CASES + HELD_OUT if c["id"] == args.case)
        result = run_case(case)
        with open(args.out, "a") as handle:
            handle.write(json.dumps(result) + "\n")
        return 0
    for case in HELD_OUT if args.held_out else CASES:
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--case", case["id"], "--out", args.out],
                timeout=args.timeout,
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
            )
            status = "ok" if proc.returncode == 0 else f"rc {proc.returncode}: {proc.stderr[-1500:]}"
        except subprocess.TimeoutExpired:
            status = "timeout"
        print(f"{case['id']}: {status} ({time.perf_counter() - started:.0f} s)", flush=True)
        if status != "ok":
            with open(args.out, "a") as handle:
                handle.write(json.dumps({"case": case, "error": status}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
