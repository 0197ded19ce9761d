"""An infeasible plan says why each suggestion it considered was not made (``suggestions_skipped``).

A suggestion a cheap bound ruled out (the model states alone exceed the GPU on every count tried:
``suggest.states_unfit``), whose search found no layout that fits, or whose GPU type cannot run the
job as asked, used to vanish from the answer without a word: a 13B model's full training on one
24 GB card listed no shorter sequence and no LoRA, and nothing said they had been tried."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient


def plan(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    assert result["status"] == "infeasible"
    return result


def skipped(result: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for entry in result["suggestions_skipped"]:
        out.setdefault(entry["kind"], []).append(entry["reason"])
    return out


def test_a_shorter_sequence_the_states_rule_out_is_said_with_the_numbers(client: TestClient) -> None:
    # 13B x 14 bytes of model states (Megatron's precision-aware optimizer: 2 + 2 + 2 + 8; 169.7 GiB) on
    # one 24 GiB card, no host RAM stated to offload to
    result = plan(
        client,
        {
            "model": {"preset": "llama-2-13b"},
            "cluster": {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"seq_len": 2048, "global_batch_size": 8},
        },
    )
    made = {s["kind"] for s in result["suggestions"]}
    why = skipped(result)
    assert "shorter_sequence" not in made
    (sequence,) = why["shorter_sequence"]
    assert "the model states alone need 169.7 GiB per GPU" in sequence, sequence
    assert "GiB allowed" in sequence and "whatever the sequence" in sequence
    # LoRA keeps a 16-bit 13B base (26 GB): over the card before any search, said with the numbers
    # (searched, an absurd model's LoRA took the request's budget from every suggestion after it:
    # hostile review); QLoRA fits
    assert "qlora" in made and "lora" not in made
    assert why["lora"] == [
        "no layout fits on the GPUs given with lora (rank 16): the frozen base alone needs 24.2 GiB per "
        "GPU sharded over all 1 GPUs (nothing offloaded); 22.8 GiB allowed"
    ]
    # every kind considered is either made or skipped with a reason
    considered = {"lora", "qlora", "shorter_sequence", "more_gpus", "offload", "other_gpu"}
    assert considered <= made | set(why), (made, why)
    assert all(reasons and all(reasons) for reasons in why.values())


def test_another_gpu_that_cannot_run_the_precision_is_said(client: TestClient) -> None:
    # fp8 on an L40S: an MI250X GCD (64 GiB, more memory) has no fp8 units, so it is not suggested, with why
    result = plan(
        client,
        {
            "model": {"preset": "llama-3.1-70b"},
            "cluster": {"gpu": "l40s-48gb", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"seq_len": 4096, "global_batch_size": 8, "precision": "fp8"},
        },
    )
    others = {s["gpu"] for s in result["suggestions"] if s["kind"] == "other_gpu"}
    assert "mi250x-gcd-64gb" not in others and "b200-sxm-180gb" in others
    (mi250x,) = [r for r in skipped(result)["other_gpu"] if r.startswith("mi250x-gcd-64gb:")]
    assert mi250x.startswith("mi250x-gcd-64gb: has no fp8 support"), mi250x


def test_capacity_says_the_states_bound_with_its_numbers(client: TestClient) -> None:
    # a 70B model's states (1.1 TB) on at most one node of one 24 GiB card: said with the numbers
    body = {
        "model": {"preset": "llama-3.1-70b"},
        "training": {"seq_len": 2048, "global_batch_size": 8},
        "gpus": ["l4-24gb"],
        "gpus_per_node": 1,
        "max_nodes": 1,
    }
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    (option,) = response.json()["options"]
    assert not option["fits"]
    assert option["note"].startswith("the model states alone need "), option["note"]
    assert "sharded over all 1 GPUs" in option["note"] and "GiB allowed" in option["note"]


def test_a_method_change_the_shorter_sequence_alone_makes_needless_is_skipped(client: TestClient) -> None:
    """Qwen2.5-7B LoRA at 32k on one A100: "qlora with training.seq_len 16384 fits" came beside
    "training.seq_len 16384 fits", faster: QLoRA bought nothing there (fine-tuner review). It is said
    among the skipped, with the sequence that fits alone."""
    result = plan(
        client,
        {
            "model": {"preset": "qwen2.5-7b"},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1},
            "training": {"seq_len": 32768, "global_batch_size": 8, "method": "lora", "lora_rank": 16},
        },
    )
    made = {s["kind"]: s for s in result["suggestions"]}
    assert made["shorter_sequence"]["seq_len"] == 16384
    assert "qlora" not in made
    (why,) = skipped(result)["qlora"]
    assert "training.seq_len 16384, fits without changing the method" in why, why


def test_the_closest_miss_says_when_no_requested_launcher_runs_it_and_the_headroom_it_misses(
    client: TestClient,
) -> None:
    """70B on 24 A100s for Accelerate's FSDP with 20% headroom: every layout Accelerate runs is bounded
    by its model states (65.7 GiB on 16 GPUs), so the closest miss is a tp 2 pp 12 layout Accelerate
    does not run, shown with its estimate's "fits": true and no word of either (an infeasible-jobs
    review): the detail says no requested launcher runs it, the estimate that it misses the headroom."""
    result = plan(
        client,
        {
            "model": {"preset": "llama-3.1-70b"},
            "cluster": {"gpu": "a100-sxm-80gb", "num_nodes": 3, "gpus_per_node": 8},
            "training": {"seq_len": 8192, "global_batch_size": 64},
            "constraints": {"frameworks": ["fsdp"], "min_headroom_fraction": 0.2},
            "launchers": ["accelerate"],
        },
    )
    closest = result["closest"]
    assert "no requested launcher runs this layout" in closest["detail"], closest["detail"]
    estimate = closest["estimate"]
    assert estimate["fits"] is True  # on the card
    assert any("not the 64.0 GiB per GPU the plan allows" in w for w in estimate["warnings"]), estimate


def test_qlora_that_fsdp1_cannot_shard_is_told_lora_fits_and_why_more_gpus_do_not_help(
    client: TestClient,
) -> None:
    """QLoRA of Qwen3-30B-A3B on FSDP alone: its FSDP1 units cannot shard the fused experts peft adapts
    (validate's peft_fused_experts_fsdp1), so every sharded layout breaks a rule and the answer said
    only "buy a B200" and "no layout fits on up to 1,024 GPUs", where LoRA (FSDP2) fits the 8 L4s
    given (a review of the ordinary requests)."""
    result = plan(
        client,
        {
            "model": {"preset": "qwen3-30b-a3b"},
            "cluster": {"gpu": "l4-24gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 2048, "global_batch_size": 16, "method": "qlora"},
            "constraints": {"frameworks": ["fsdp"]},
        },
    )
    lora = next(s for s in result["suggestions"] if s["kind"] == "lora")
    assert "fits on the 8 GPUs given" in lora["detail"], lora
    more = " ".join(skipped(result)["more_gpus"])
    assert "huggingface/peft#3080" in more, more


def test_a_gpu_miss_that_also_needs_more_host_ram_than_stated_says_both(client: TestClient) -> None:
    """405B on 8 H100s with 2 TiB of host RAM per node: the closest miss offloads to the host and was
    "8.4 GiB over" on the GPU alone, while it needs 6 TiB of host RAM (an infeasible-jobs review)."""
    result = plan(
        client,
        {
            "model": {"preset": "llama-3.1-405b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 8, "cpu_memory_bytes_per_node": 2**41},
            "training": {"seq_len": 8192, "global_batch_size": 256},
        },
    )
    memory = next(r for r in result["rejected"] if r["reason"] == "does not fit in GPU memory")
    assert "GiB a plan uses of the nodes' 2048.0" in memory["detail"], memory
    assert "of the nodes' 2048.0" in result["closest"]["detail"]
