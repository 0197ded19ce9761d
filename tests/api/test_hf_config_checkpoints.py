"""A config.json's quantization_config and a multimodal wrapper's vision tower (config review, stop 44):
a bitsandbytes 4-bit checkpoint was planned as a 16-bit base (LoRA: 52 GiB where the NF4 base that
loads is 43) and as full training (which the Trainer refuses on a quantized model); DeepSeek-V3's
official fp8 config and GPT-OSS's mxfp4 one were read without a word; Gemma 3's 4B resolved to the
language model's 3.88B with no note that SigLIP's 420M were left out."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}
BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True}  # fmt: skip
# Gemma 2 2B's shapes: a family whose activations overflow fp16 (defaults.FP16_OVERFLOW_FAMILIES)
GEMMA2: dict[str, Any] = {
    "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
}  # fmt: skip


def _estimate(client: TestClient, config: dict[str, Any], method: str) -> Any:
    body = {
        "model": {"hf_config": config},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 2048, "global_batch_size": 8, "method": method},
        "layout": {"framework": "deepspeed", "zero_stage": 0, "dp": 8},
    }
    return client.post("/v1/estimates", json=body)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_4bit_checkpoint_is_trained_by_qlora_only(client: TestClient, method: str) -> None:
    config = LLAMA | {"quantization_config": BNB_4BIT}
    refused = _estimate(client, config, method)
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert error["field"] == "training.method" and "qlora" in error["message"]
    qlora = _estimate(client, config, "qlora")
    assert qlora.status_code == 200, qlora.text
    assert qlora.json() == _estimate(client, LLAMA, "qlora").json()  # the same NF4 base either way


def _one_gpu_plan(client: TestClient, config: dict[str, Any], method: str) -> dict[str, Any]:
    """A feasible plan of ``config`` on one H100 that renders the HF Trainer's files."""
    body = {
        "model": {"hf_config": config},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 2048, "global_batch_size": 8, "method": method},
        "launchers": ["hf_trainer"],
    }
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201 and plan.json()["status"] == "feasible", plan.text
    return dict(plan.json())


def _file(client: TestClient, plan: dict[str, Any], name: str) -> Any:
    response = client.get(f"/v1/plans/{plan['id']}/artifacts/{name}")
    assert response.status_code == 200, response.text
    return response.json() if name.endswith(".json") else response.text


def test_a_4bit_checkpoint_is_planned_with_its_own_quantization_config(client: TestClient) -> None:
    """A quantized-checkpoints review: from_pretrained loads a stored 4-bit checkpoint with its saved
    quantization_config (the launch files' bnb_config.json is not applied), whose other fields every
    estimate ignored. Without double quantization its constants are an fp32 absmax per 64 weights
    (0.5 bits, not 0.127): more memory; MLPs kept in 16 bits, or fp32 compute, are refused naming the
    key."""
    single = LLAMA | {"quantization_config": BNB_4BIT | {"bnb_4bit_use_double_quant": False}}
    double = _estimate(client, LLAMA | {"quantization_config": BNB_4BIT}, "qlora").json()
    plain = _estimate(client, single, "qlora").json()
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)  # LLAMA's layer Linears (GQA)
    more = plain["memory"]["per_gpu"]["parameters"] - double["memory"]["per_gpu"]["parameters"]
    assert more == pytest.approx(linear * (0.5 - (8 / 64 + 32 / (64 * 256))) / 8, rel=0.02)
    assert any("NF4 Linear weights at 4.5 bits" in a for a in plain["assumptions"]), plain["assumptions"]
    for key, value in (("llm_int8_skip_modules", ["lm_head", "mlp"]), ("bnb_4bit_compute_dtype", "float32")):
        config = LLAMA | {"quantization_config": BNB_4BIT | {key: value}}
        refused = _estimate(client, config, "qlora")
        assert refused.status_code == 422, refused.text
        assert [e["field"] for e in refused.json()["errors"]] == [
            f"model.hf_config.quantization_config.{key}"
        ]
    skipped_head = LLAMA | {"quantization_config": BNB_4BIT | {"llm_int8_skip_modules": ["lm_head"]}}
    assert _estimate(client, skipped_head, "qlora").json()["memory"] == double["memory"]


@pytest.mark.parametrize(
    ("quantization", "field"),
    [
        (
            {"quant_method": "bitsandbytes", "load_in_8bit": True},
            "model.hf_config.quantization_config.load_in_8bit",
        ),
        # neither format set: no bitsandbytes base (it was refused as an 8-bit one it does not state)
        (
            {"quant_method": "bitsandbytes", "load_in_4bit": False, "load_in_8bit": False},
            "model.hf_config.quantization_config.load_in_4bit",
        ),
        ({"quant_method": "gptq", "bits": 4}, "model.hf_config.quantization_config.quant_method"),
        ({"quant_method": "awq", "bits": 4}, "model.hf_config.quantization_config.quant_method"),
    ],
)
def test_a_base_stored_in_a_format_not_modelled_is_refused_naming_the_key(
    client: TestClient, quantization: dict[str, Any], field: str
) -> None:
    refused = _estimate(client, LLAMA | {"quantization_config": quantization}, "lora")
    assert refused.status_code == 422, refused.text
    assert [e["field"] for e in refused.json()["errors"]] == [field]


@pytest.mark.parametrize(
    ("method", "loader"),
    [("fp8", "FineGrainedFP8Config(dequantize=True)"), ("mxfp4", "Mxfp4Config(dequantize=True)"),
     ("compressed-tensors", "CompressedTensorsConfig(run_compressed=False)"),
     ("fbgemm_fp8", "a conversion to 16-bit weights")],
)  # fmt: skip
def test_a_checkpoint_stored_in_fp8_or_mxfp4_is_planned_dequantized_and_says_so(
    client: TestClient, method: str, loader: str
) -> None:
    """Each format's note names its own loader (a quantized-checkpoints review: every note named the
    fp8 and mxfp4 configs, for compressed-tensors and fbgemm_fp8 too)."""
    config = LLAMA | {"quantization_config": {"quant_method": method}}
    answer = _estimate(client, config, "full")
    assert answer.status_code == 200, answer.text
    plain = _estimate(client, LLAMA, "full").json()
    assert answer.json()["memory"] == plain["memory"]
    said = [w for w in answer.json()["warnings"] if w.startswith(f"quantization_config {method}")]
    assert len(said) == 1 and "dequantized" in said[0] and loader in said[0], said


def test_a_multimodal_config_says_its_vision_tower_is_not_counted(client: TestClient) -> None:
    body = {
        "model": {"preset": "gemma-3-12b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 2048, "global_batch_size": 8},
        "layout": {"framework": "fsdp", "zero_stage": 3, "dp": 8},
    }
    answer = client.post("/v1/estimates", json=body)
    assert answer.status_code == 200, answer.text
    assert any("vision tower" in w for w in answer.json()["warnings"])
    text_only = copy.deepcopy(body)
    text_only["model"] = {"preset": "gemma-3-1b"}  # model_type gemma3_text: no tower to leave out
    assert not any(
        "vision tower" in w for w in client.post("/v1/estimates", json=text_only).json()["warnings"]
    )


@pytest.mark.parametrize(
    ("quant_method", "method", "said"),
    [
        ("mxfp4", "lora", "quantization_config=Mxfp4Config(dequantize=True)"),
        ("fp8", "full", "quantization_config=FineGrainedFP8Config(dequantize=True)"),
        ("compressed-tensors", "lora", "quantization_config=CompressedTensorsConfig(run_compressed=False)"),
        ("fbgemm_fp8", "lora", "convert it to 16-bit weights first"),  # FBGEMM's layers neither train nor
        ("mxfp4", "qlora", "convert it to 16-bit weights first"),  # dequantize; NF4 needs a 16-bit base
    ],
)
def test_the_launch_files_say_how_to_load_a_checkpoint_stored_quantized(
    client: TestClient, quant_method: str, method: str, said: str
) -> None:
    """The estimate plans fp8 / mxfp4 checkpoints dequantized; the launch files did not say so, and
    from_pretrained keeps the stored format unless asked (GPT-OSS's MXFP4 experts do not train)."""
    body = {
        "model": {"hf_config": LLAMA | {"quantization_config": {"quant_method": quant_method}}},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 2048, "global_batch_size": 8, "method": method},
        "launchers": ["accelerate", "hf_trainer", "deepspeed"],
    }
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    scripts = [a for a in plan.json()["artifacts"] if a["name"].endswith((".sh", ".py", ".yaml"))]
    texts = {a["name"]: client.get(a["url"]).text for a in scripts}
    stating = [name for name, text in texts.items() if "checkpoint: its weights are stored" in text]
    assert stating and all(said in texts[name] for name in stating), texts.keys()
    plain = dict(body, model={"hf_config": LLAMA})
    again = client.post("/v1/plans", json=plain).json()
    assert not any("checkpoint: its weights" in client.get(a["url"]).text for a in again["artifacts"])


def test_qlora_launch_files_load_the_base_in_the_compute_dtype_and_a_stored_one_with_its_config(
    client: TestClient,
) -> None:
    """A quantized-checkpoints review: the QLoRA header named no dtype, so transformers 5 loaded an fp32
    checkpoint's embeddings, head and norms in fp32 (the estimate counts them 16-bit); and told a stored
    4-bit checkpoint to load with bnb_config.json, which from_pretrained does not apply to it."""
    for config, stored in ((LLAMA, False), (LLAMA | {"quantization_config": BNB_4BIT}, True)):
        script = _file(client, _one_gpu_plan(client, config, "qlora"), "hf_trainer_launch.sh")
        assert "from_pretrained(..., dtype=torch.bfloat16" in script, script
        assert ("its saved quantization_config applies" in script) == stored
        assert ("quantization_config=BitsAndBytesConfig" in script) != stored


def test_a_checkpoint_planned_dequantized_says_how_in_the_megatron_file_too(client: TestClient) -> None:
    """A quantized-checkpoints review: the fp8 warning says "the launch files say how", and Megatron's
    said nothing of the stored weights, which its --load conversion must dequantize first."""
    body = {
        "model": {"hf_config": LLAMA | {"quantization_config": {"quant_method": "fp8"}}},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "constraints": {"frameworks": ["megatron"]},
        "launchers": ["megatron"],
    }
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201 and plan.json()["status"] == "feasible", plan.text
    script = client.get(f"/v1/plans/{plan.json()['id']}/artifacts/megatron_launch.sh").text
    assert "its weights are stored fp8: dequantize them to 16-bit weights" in script
    assert "FineGrainedFP8Config(dequantize=True)" in script


@pytest.mark.parametrize(("preset", "stored"), [("gpt-oss-20b", "mxfp4"), ("deepseek-v3", "fp8")])
def test_presets_of_checkpoints_stored_quantized_say_how_they_load(
    client: TestClient, preset: str, stored: str
) -> None:
    """A quantized-checkpoints review: the GPT-OSS and DeepSeek-V3 presets name checkpoints stored in
    MXFP4 and fp8 blocks, and were planned as 16-bit ones with no word of it: the same config pasted
    got the note and the launch files' loader."""
    notes = client.get(f"/v1/models/{preset}").json()["notes"]
    assert any(note.startswith(f"quantization_config {stored}") for note in notes), notes


def test_a_multimodal_checkpoints_launch_files_keep_its_vision_tower_out_as_estimated(
    client: TestClient,
) -> None:
    """A multimodal review: the estimate plans Gemma 3's language model alone ("a text-only fine-tune"),
    while from_pretrained builds Gemma3ForConditionalGeneration with a trainable vision tower and
    lora_config.json's suffix targets put adapters on SigLIP's q/k/v_proj too. The launch files freeze
    the tower and projector and exclude them from the adapters."""
    text = {"model_type": "gemma3_text", "hidden_size": 256, "intermediate_size": 1024,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
            "vocab_size": 32000}  # fmt: skip
    config = {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 1152}}
    plan = _one_gpu_plan(client, config, "lora")
    lora = _file(client, plan, "lora_config.json")
    assert lora["exclude_modules"] == r".*\b(vision_tower|vision_model|multi_modal_projector)\b.*"
    assert re.fullmatch(
        lora["exclude_modules"], "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj"
    )
    assert not re.fullmatch(lora["exclude_modules"], "model.language_model.layers.0.self_attn.q_proj")
    assert "must freeze the vision tower and projector" in _file(client, plan, "hf_trainer_launch.sh")
    # a text-only config has none of it
    assert "exclude_modules" not in _file(client, _one_gpu_plan(client, text, "lora"), "lora_config.json")
    # a wrapper's preset states its text_config alone, and its tower is built all the same (Gemma3Config
    # fills in a default SiglipVisionConfig): the same exclusion (a change review)
    body = {"model": {"preset": "gemma-3-12b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 1},
            "training": {"seq_len": 2048, "global_batch_size": 8, "method": "lora"},
            "launchers": ["hf_trainer"]}  # fmt: skip
    preset = client.post("/v1/plans", json=body).json()
    assert _file(client, preset, "lora_config.json")["exclude_modules"] == lora["exclude_modules"]


def test_a_stored_checkpoint_packed_as_uint8_is_never_planned_sharded(client: TestClient) -> None:
    """A change review: a stored 4-bit checkpoint whose quant storage is uint8 (BitsAndBytesConfig's
    default, which from_pretrained keeps) was planned FSDP FULL_SHARD, which cannot flatten integer
    tensors (ZeRO-3 cannot partition them either). Such layouts are refused, so the plan keeps the
    weights whole on each rank; stored as bfloat16, they shard. Nor is bnb_config.json written for it:
    the checkpoint's own config applies."""
    wide = LLAMA | {"num_hidden_layers": 80, "hidden_size": 8192, "intermediate_size": 28672,
                    "num_attention_heads": 64}  # fmt: skip
    cluster = {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 4}
    training = {"seq_len": 2048, "global_batch_size": 16, "method": "qlora"}

    def plan(storage: str | None) -> dict[str, Any]:
        quantization = BNB_4BIT | ({"bnb_4bit_quant_storage": storage} if storage else {})
        body = {"model": {"hf_config": wide | {"quantization_config": quantization}}, "cluster": cluster,
                "training": training, "launchers": ["accelerate", "deepspeed"]}  # fmt: skip
        response = client.post("/v1/plans", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    for storage in (None, "uint8"):
        packed = plan(storage)
        layouts = [packed["recommended"]] if packed["recommended"] else []
        layouts += packed["alternatives"]
        for candidate in layouts:
            lo = candidate["layout"]
            sharded = (lo["framework"] == "fsdp" and lo["zero_stage"] >= 2) or (
                lo["framework"] == "deepspeed" and lo["zero_stage"] >= 3
            )
            assert not sharded, lo
        assert "bnb_config.json" not in {a["name"] for a in packed["artifacts"]}
    floating = plan("bfloat16")
    assert floating["status"] == "feasible"


def test_a_4bit_checkpoints_saved_compute_dtype_is_the_precision(client: TestClient) -> None:
    """from_pretrained builds a stored checkpoint's Linear4bit layers with its saved bnb_4bit_compute_dtype
    whatever dtype the rest loads in: a bf16 one on a T4 was timed at fp16, its GEMMs running bf16 on a
    part without bf16 units (defaults review). The default follows it (an fp16 one left to an H100 was a
    422 naming the bf16 it never asked for: change review); another precision is refused; a GPU without
    the checkpoint's dtype is told once, with the way out."""

    def on(gpu: str, compute: str, config: dict[str, Any] = LLAMA, **training: Any) -> Any:
        stored = config | {"quantization_config": BNB_4BIT | {"bnb_4bit_compute_dtype": compute}}
        body = {
            "model": {"hf_config": stored},
            "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 1},
            "training": {"seq_len": 2048, "global_batch_size": 8, "method": "qlora"} | training,
            "layout": {"framework": "deepspeed", "zero_stage": 0, "dp": 1},
        }
        return client.post("/v1/estimates", json=body)

    for gpu, compute, resolved in (
        ("h100-sxm-80gb", "bfloat16", "bf16"),
        ("h100-sxm-80gb", "float16", "fp16"),
        ("t4-16gb", "float16", "fp16"),
    ):
        answer = on(gpu, compute)
        assert answer.status_code == 200, answer.text
        assert answer.json()["resolved_defaults"]["training.precision"] == resolved
    gemma = GEMMA2
    assert on("t4-16gb", "float16", gemma).json()["resolved_defaults"]["training.precision"] == "fp16"
    for gpu, compute, training in (
        ("h100-sxm-80gb", "bfloat16", {"precision": "fp16"}),
        ("h100-sxm-80gb", "float16", {"precision": "bf16"}),
        ("t4-16gb", "bfloat16", {}),
        ("t4-16gb", "bfloat16", {"precision": "fp16"}),
    ):
        refused = on(gpu, compute, **training)
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["errors"]
        assert error["field"] == "training.precision", error
        assert "checkpoint computes in" in error["message"], error


def test_capacity_and_warnings_say_what_a_stored_compute_dtype_leaves(client: TestClient) -> None:
    """A GPU type without a bf16 checkpoint's dtype was told to "ask for another precision", which the
    checkpoint refuses; a Gemma fp16 checkpoint's overflow warning advised precisions it refuses (change
    review)."""
    bf16 = LLAMA | {"quantization_config": BNB_4BIT | {"bnb_4bit_compute_dtype": "bfloat16"}}
    body = {
        "model": {"hf_config": bf16},
        "training": {"seq_len": 2048, "global_batch_size": 8, "method": "qlora"},
        "gpus": ["t4-16gb", "h100-sxm-80gb"],
    }
    answer = client.post("/v1/capacity", json=body)
    assert answer.status_code == 200, answer.text
    notes = {o["gpu"]: o["note"] for o in answer.json()["options"]}
    assert "checkpoint computes in bf16" in notes["t4-16gb"] and "another precision" not in notes["t4-16gb"]
    gemma = GEMMA2 | {"quantization_config": BNB_4BIT | {"bnb_4bit_compute_dtype": "float16"}}
    estimate = client.post(
        "/v1/estimates",
        json={
            "model": {"hf_config": gemma},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"seq_len": 2048, "global_batch_size": 8, "method": "qlora"},
            "layout": {"framework": "deepspeed", "zero_stage": 0, "dp": 1},
        },
    )
    assert estimate.status_code == 200, estimate.text
    (overflow,) = [w for w in estimate.json()["warnings"] if "exceed fp16's range" in w]
    assert "this 4-bit checkpoint computes in fp16" in overflow and "train it in bf16" not in overflow
