"""BERT-class encoders (issue 27, "small models and short steps"): a BERT or RoBERTa request is
estimated and planned (it was a 422, "model_type 'bert' is not supported"), and the search offers it
only the frameworks whose launchers load any Hugging Face model: Megatron-LM's and torchtitan's
targets build causal GPT-style decoders and refuse it."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

V100_16GB = {"gpu": "v100-sxm2-16gb", "num_nodes": 1, "gpus_per_node": 1}
# SQuAD v1.1 fine-tuning as NVIDIA DeepLearningExamples runs BERT-large: seq 384, fp16
SQUAD = {"seq_len": 384, "global_batch_size": 32, "precision": "fp16", "tokens": 10**8}
BERT_LARGE_QA = {
    "model_type": "bert",
    "architectures": ["BertForQuestionAnswering"],
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "vocab_size": 30522,
}


def estimate_body(model: dict[str, Any], **layout: Any) -> dict[str, Any]:
    return {
        "model": model,
        "cluster": V100_16GB,
        "training": SQUAD,
        "layout": {"framework": "deepspeed", "dp": 1, "zero_stage": 0, "micro_batch_size": 32} | layout,
    }


def test_bert_large_estimate_on_one_v100_is_answered(client: TestClient) -> None:
    response = client.post("/v1/estimates", json=estimate_body({"preset": "bert-large-uncased"}))
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["parameters_total"] == 335_174_458
    assert result["time"]["step_s"] > 0
    assert result["memory"]["per_gpu"]["activations"] > 0


def test_a_bert_hf_config_with_its_task_head_is_estimated(client: TestClient) -> None:
    response = client.post("/v1/estimates", json=estimate_body({"hf_config": BERT_LARGE_QA}))
    assert response.status_code == 200, response.text
    assert response.json()["parameters_total"] == 334_094_338  # BertForQuestionAnswering


def test_an_unknown_encoder_head_is_a_422_naming_architectures(client: TestClient) -> None:
    config = BERT_LARGE_QA | {"architectures": ["BertForMultipleChoice"]}
    problem = assert_problem(client.post("/v1/estimates", json=estimate_body({"hf_config": config})), 422)
    assert problem["errors"][0]["field"] == "model.hf_config.architectures", problem


def test_bert_large_plan_on_one_v100_is_created_without_megatron(client: TestClient) -> None:
    body = {"model": {"preset": "bert-large-uncased"}, "cluster": V100_16GB, "training": SQUAD}
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["recommended"]["estimate"]["fits"] is True
    offered = [plan["recommended"], *plan["alternatives"]]
    assert {c["layout"]["framework"] for c in offered} <= {"deepspeed", "fsdp"}


def test_megatron_alone_refuses_an_encoder(client: TestClient) -> None:
    body = {
        "model": {"preset": "bert-large-uncased"},
        "cluster": V100_16GB,
        "training": SQUAD,
        "constraints": {"frameworks": ["megatron"]},
    }
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert {e["field"] for e in problem["errors"]} == {"constraints.frameworks"}, problem
    assert "bidirectional encoder" in problem["detail"]


def test_an_encoder_described_by_explicit_fields_is_the_preset(client: TestClient) -> None:
    """A catalog preset's architecture, sent back as explicit fields, is estimated as the preset: the
    encoder's fields (bidirectional, head, token types, post-norm) were not in the explicit form, so
    BERT described that way was a 422 (unknown fields) or, without them, timed as a causal decoder."""
    shown = client.get("/v1/models/bert-large-uncased").json()["architecture"]
    explicit = {k: v for k, v in shown.items() if k not in ("name", "family")}
    assert explicit["bidirectional"] and explicit["head"] == "masked_lm"
    by_fields = client.post("/v1/estimates", json=estimate_body({"architecture": explicit}))
    by_preset = client.post("/v1/estimates", json=estimate_body({"preset": "bert-large-uncased"}))
    assert by_fields.status_code == by_preset.status_code == 200, by_fields.text
    ours, theirs = by_fields.json(), by_preset.json()
    assert ours["memory"] == theirs["memory"] and ours["time"] == theirs["time"]
    decoder = {**explicit, "bidirectional": False}  # an encoder's head on a causal model
    problem = assert_problem(client.post("/v1/estimates", json=estimate_body({"architecture": decoder})), 422)
    assert problem["errors"][0]["field"] == "model.architecture.head"


def test_a_sequence_past_a_learned_position_table_is_refused_on_every_path(client: TestClient) -> None:
    """BERT has 512 learned positions, RoBERTa 512 usable of its 514 rows: a plan at 2,048 said
    feasible (small-model review, stop 41). Plans, estimates and capacity refuse it, naming the field."""
    training = {"seq_len": 2048, "global_batch_size": 32}
    cluster = {"gpu": "a10g-24gb", "num_nodes": 1, "gpus_per_node": 2}
    for path, extra in (
        ("/v1/plans", {"cluster": cluster}),
        ("/v1/estimates", {"cluster": cluster, "layout": {"framework": "fsdp", "dp": 2}}),
        ("/v1/capacity", {"gpus": ["a10g-24gb"]}),
    ):
        problem = assert_problem(
            client.post(path, json={"model": {"preset": "bert-base-uncased"}, "training": training} | extra),
            422,
        )
        assert problem["errors"][0]["field"] == "training.seq_len" and "512 positions" in problem["detail"], (
            path
        )
    roberta = {"model": {"preset": "roberta-base"}, "cluster": cluster,
               "training": {"seq_len": 513, "global_batch_size": 32}}  # fmt: skip
    assert "512 positions" in assert_problem(client.post("/v1/plans", json=roberta), 422)["detail"]


def test_an_encoder_preset_trains_the_task_head_asked_for(client: TestClient) -> None:
    """A review's case: {"preset": "roberta-base", "head": "sequence_classification"} was a 422, so a
    classification fine-tune needed a whole config.json. RobertaForSequenceClassification with 3
    labels: the encoder without a pooler (124,055,040) + its head's dense h x h + bias and out_proj
    h x 3 + bias = 124,647,939."""
    body = {"model": {"preset": "roberta-base", "head": "sequence_classification", "num_labels": 3},
            "cluster": {"gpu": "t4-16gb", "num_gpus": 1},
            "training": {"seq_len": 512, "global_batch_size": 32}, "layout": {"dp": 1}}  # fmt: skip
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["parameters_total"] == 124_055_040 + 768 * 768 + 768 + 768 * 3 + 3
    decoder = body | {"model": {"preset": "llama-3.2-1b", "head": "sequence_classification"}}
    assert (
        assert_problem(client.post("/v1/estimates", json=decoder), 422)["errors"][0]["field"] == "model.head"
    )
    labels_alone = body | {"model": {"preset": "roberta-base", "num_labels": 3}}
    problem = assert_problem(client.post("/v1/estimates", json=labels_alone), 422)
    assert problem["errors"][0]["field"] == "model.num_labels"
    assert not problem["errors"][0]["message"].startswith("Value error")


def test_lora_on_an_encoder_task_head_trains_the_head_peft_saves(client: TestClient) -> None:
    """A review: LoRA on RoBERTa classification counted the adapters alone, but PEFT's
    PeftModelForSequenceClassification also trains a copy of the "classifier" module
    (modules_to_save: RobertaClassificationHead's dense 768 x 768 + bias and out_proj 768 x 3 + bias =
    592,899 parameters, twice the adapters here). Adapters: rank 8 on q_proj and v_proj of 12 layers,
    8 x (768 + 768) x 2 x 12 = 294,912. Each trainable parameter holds 12 B of fp32 Adam states."""
    body = {"model": {"preset": "roberta-base", "head": "sequence_classification", "num_labels": 3},
            "cluster": {"gpu": "t4-16gb", "num_gpus": 1},
            "training": {"seq_len": 512, "global_batch_size": 32, "method": "lora", "lora_rank": 8,
                         "lora_targets": ["q_proj", "v_proj"]},
            "layout": {"dp": 1}}  # fmt: skip
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    head = 769 * 768 + 769 * 3
    assert response.json()["memory"]["per_gpu"]["optimizer_states"] == 12 * (294_912 + head)
    masked = body | {"model": {"preset": "roberta-base"}}  # a plain PeftModel: no head saved
    assert client.post("/v1/estimates", json=masked).json()["memory"]["per_gpu"]["optimizer_states"] == (
        12 * 294_912
    )


def test_xlm_roberta_and_camembert_resolve_as_the_roberta_they_are(client: TestClient) -> None:
    """transformers' XLM-RoBERTa and CamemBERT are RoBERTa's classes renamed ("Copied from
    transformers.models.roberta.modeling_roberta"): their configs were refused (a model type not
    supported; an encoder review). Each resolves as the same config read as RoBERTa does, but for its
    family: xlm-roberta-base to 278,295,186 parameters (the model card's 278M), its launch files
    wrapping XLMRobertaLayer."""
    base = {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "vocab_size": 250002,
        "max_position_embeddings": 514,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
    }

    def resolve(model_type: str, prefix: str, head: str = "ForSequenceClassification") -> dict[str, Any]:
        config = base | {"model_type": model_type, "architectures": [prefix + head]}
        response = client.post("/v1/models/resolve", json={"model": {"hf_config": config}})
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    roberta = resolve("roberta", "Roberta")
    for model_type, prefix in (("xlm-roberta", "XLMRoberta"), ("camembert", "Camembert")):
        other = resolve(model_type, prefix)
        assert other["parameters"] == roberta["parameters"], model_type
        assert other["architecture"]["family"] == model_type
    assert resolve("xlm-roberta", "XLMRoberta", "ForMaskedLM")["parameters"]["total"] == 278_295_186
    plan = client.post(
        "/v1/plans",
        json={
            "model": {
                "hf_config": base | {"model_type": "xlm-roberta", "architectures": ["XLMRobertaForMaskedLM"]}
            },
            "cluster": {"gpu": "a10-24gb", "num_nodes": 1, "gpus_per_node": 2},
            "training": {"seq_len": 512, "global_batch_size": 32},
            "constraints": {"frameworks": ["fsdp"]},
            "launchers": ["accelerate"],
        },
    )
    assert plan.status_code == 201 and plan.json()["status"] == "feasible", plan.text
    files = {a["name"]: client.get(a["url"]).text for a in plan.json()["artifacts"]}
    assert "XLMRobertaLayer" in files["accelerate_config.yaml"], files["accelerate_config.yaml"]


def test_a_question_answering_head_takes_two_labels(client: TestClient) -> None:
    """*ForQuestionAnswering splits its logits into the span's start and end (logits.split(1, dim=-1)):
    num_labels 3 was estimated and rendered, and the run fails at its first forward (an encoder
    review). Refused wherever it is stated; 2 (or left out) resolves."""
    config = BERT_LARGE_QA | {"num_labels": 3}
    error = assert_problem(client.post("/v1/models/resolve", json={"model": {"hf_config": config}}), 422)
    assert error["errors"][0]["field"] == "model.hf_config.num_labels", error
    assert error["errors"][0]["rule"] == "qa_labels"
    two = BERT_LARGE_QA | {"num_labels": 2}
    assert client.post("/v1/models/resolve", json={"model": {"hf_config": two}}).status_code == 200


def test_an_encoders_activation_note_names_its_own_norm_and_loss(client: TestClient) -> None:
    """BERT's estimate said its activations held an "RMSNorm fp32 upcast" and an "fp32 log-softmax":
    BERT has LayerNorm and its head's loss runs in the model dtype (an encoder review)."""
    response = client.post("/v1/estimates", json=estimate_body({"preset": "bert-large-uncased"}))
    assert response.status_code == 200, response.text
    note = next(a for a in response.json()["assumptions"] if a.startswith("activations:"))
    assert "RMSNorm" not in note and "LayerNorm" in note and "model dtype" in note, note
    llama = client.post(
        "/v1/estimates",
        json={
            "model": {"preset": "llama-3.1-8b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 4096, "global_batch_size": 64},
            "layout": {"framework": "fsdp", "zero_stage": 3},
        },
    )
    note = next(a for a in llama.json()["assumptions"] if a.startswith("activations:"))
    assert "RMSNorm fp32 upcast, fp32 log-softmax" in note, note


def test_a_token_classification_head_is_estimated_and_launched(client: TestClient) -> None:
    """NER and tagging fine-tunes (dslim/bert-base-NER: BertForTokenClassification, 9 labels) were
    refused: the head is the encoder without a pooler, dropout and a classifier h -> L on every token,
    a label per token (transformers modeling_bert.py; an encoder review). bert-base-cased's encoder
    (108,310,272 with its pooler) less the pooler's 590,592, plus the classifier's 768 x 9 + 9:
    107,726,601."""
    labels = ["O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
    config = {
        "model_type": "bert",
        "architectures": ["BertForTokenClassification"],
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "vocab_size": 28996,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "id2label": {str(i): label for i, label in enumerate(labels)},
    }
    resolved = client.post("/v1/models/resolve", json={"model": {"hf_config": config}}).json()
    assert resolved["architecture"]["head"] == "token_classification"
    assert resolved["architecture"]["num_labels"] == 9
    assert resolved["parameters"]["total"] == 107_726_601
    plan = client.post(
        "/v1/plans",
        json={
            "model": {"hf_config": config},
            "cluster": {"gpu": "t4-16gb", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"seq_len": 128, "global_batch_size": 32, "precision": "fp16", "method": "lora"},
            "launchers": ["hf_trainer"],
        },
    )
    assert plan.status_code == 201 and plan.json()["status"] == "feasible", plan.text
    files = {a["name"]: client.get(a["url"]).text for a in plan.json()["artifacts"]}
    launch = " ".join(files["hf_trainer_launch.sh"].split())
    assert "AutoModelForTokenClassification.from_pretrained(" in launch and "num_labels=9" in launch, launch
    assert '"task_type": "TOKEN_CLS"' in files["lora_config.json"], files["lora_config.json"]
    # a preset takes the head and its labels too
    preset = {"preset": "bert-base-uncased", "head": "token_classification", "num_labels": 9}
    assert client.post("/v1/models/resolve", json={"model": preset}).status_code == 200
