"""BERT-style encoders (issue 27, small models): parameters of a tiny BERT by hand and of the presets
as transformers counts them, the whole-square attention a bidirectional model computes, the task
heads' FLOPs and saved tensors, and the refusals of what the encoder builders cannot express."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from service.catalog.models import model as catalog_model
from service.catalog.tuning import default_tuning
from service.estimator import activations, flops, step_time
from service.estimator.errors import InvalidModel
from service.estimator.hf_config import model_from_hf_config
from service.estimator.job import make_job
from service.estimator.params import LayerKind, layer_parameters, parameter_counts
from service.estimator.tuning import attention_kernel_fractions, conservative_kernel_rate
from service.estimator.types import (
    ALL_LINEAR,
    Attention,
    Framework,
    Head,
    Layout,
    ModelSpec,
    Precision,
    TrainingSpec,
)
from service.launchers import framework_structure_refusal, megatron, torchtitan
from service.launchers.common import encoder_lora_fields
from validation.cases import DATA_DIR, H100, gpu_cluster

# A 2-layer BERT: h 8, 2 heads, intermediate 16, vocabulary 10, 6 positions, 2 token types.
TINY_CONFIG: dict[str, Any] = {
    "model_type": "bert",
    "hidden_size": 8,
    "num_attention_heads": 2,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "vocab_size": 10,
    "max_position_embeddings": 6,
}
TINY = model_from_hf_config(TINY_CONFIG)
LAYER = LayerKind(moe=False)


def test_tiny_bert_parameters_by_hand() -> None:
    counts = parameter_counts(TINY)
    # word 10*8 + positions 6*8 + token types 2*8 + embedding LayerNorm 2*8
    assert counts.embedding == 80 + 48 + 16 + 16
    # q, k, v, o 4*(8*8 + 8); intermediate 8*16 + 16, output 16*8 + 8; two LayerNorms 2*16
    assert layer_parameters(TINY, 0) == 288 + 280 + 32
    # post-norm: no norm after the last layer
    assert counts.final_norm == 0
    # masked LM: transform dense 8*8 + 8, its LayerNorm 16, the decoder tied, its bias 10
    assert counts.output == 72 + 16 + 10
    # transformers 5.24 BertForMaskedLM on the meta device: 1458 (and 1450, 1378 below)
    assert counts.total == 1458


@pytest.mark.parametrize(
    ("architecture", "total", "output"),
    [
        # pooler 8*8 + 8, classifier 8*2 + 2
        ("BertForSequenceClassification", 1450, 72 + 18),
        # qa_outputs 8*2 + 2
        ("BertForQuestionAnswering", 1378, 18),
        # the token classifier 8*2 + 2, no pooler (add_pooling_layer=False)
        ("BertForTokenClassification", 1378, 18),
    ],
)
def test_tiny_bert_task_heads_by_hand(architecture: str, total: int, output: int) -> None:
    spec = model_from_hf_config(TINY_CONFIG | {"architectures": [architecture]})
    assert parameter_counts(spec).output == output
    assert parameter_counts(spec).total == total


@pytest.mark.parametrize(
    ("preset", "total"),
    [
        # transformers 5.24 *ForMaskedLM of each config.json on the meta device (validation/param_counts.py);
        # Devlin et al. 2018 print 110M and 340M, the RoBERTa model cards 125M and 355M
        ("bert-base-uncased", 109_514_298),
        ("bert-large-uncased", 335_174_458),
        ("roberta-base", 124_697_433),
        ("roberta-large", 355_412_057),
    ],
)
def test_encoder_presets_count_as_transformers_does(preset: str, total: int) -> None:
    spec = catalog_model(preset).spec
    assert spec.bidirectional and spec.post_norm and spec.head is Head.MASKED_LM
    assert parameter_counts(spec).total == total
    # BertConfig / RobertaConfig default both dropouts to 0.1: their masks are saved
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.1, 0.1)


def test_bidirectional_attention_computes_the_whole_square() -> None:
    causal = dataclasses.replace(TINY, bidirectional=False, head=Head.CAUSAL_LM)
    s = 4
    # q_size = v_size = 8: the square is 2 x s x (8 + 8) = 128 per token
    assert flops.layer_core_flops(TINY, LAYER, s) == 128
    # no causal mask: every query sees all s keys, for the model count and the flash kernels' work
    assert flops.causal_keys_per_query(TINY, LAYER.attention, s) == 4
    assert flops.layer_core_causal_flops(TINY, LAYER, s) == 128
    flash = TrainingSpec(seq_len=s, global_batch_size=1, attention=Attention.FLASH)
    assert flops.layer_core_work_flops(TINY, LAYER, flash) == 128
    # the same layers causal: (s + 1) / 2 = 2.5 keys per query, 80; twice the causal half-square (64)
    assert flops.layer_core_causal_flops(causal, LAYER, s) == 80
    assert flops.layer_core_causal_flops(TINY, LAYER, s) == 2 * (128 / 2)


def test_tiny_bert_training_flops_by_hand() -> None:
    training = TrainingSpec(seq_len=4, global_batch_size=1)
    # per layer and token: 3 x (q,k,v,o 2*4*64 + MLP 2*2*8*16) + 3 x core 128 = 3072 + 384
    # masked-LM head: 3 x (transform 2*64 + decoder 2*8*10) = 864
    assert flops.model_flops_per_token(TINY, training, True) == 2 * (3072 + 384) + 864


def test_task_heads_flops_per_token() -> None:
    s = 4
    classifier = dataclasses.replace(TINY, head=Head.SEQUENCE_CLASSIFICATION, num_labels=3)
    qa = dataclasses.replace(TINY, head=Head.QUESTION_ANSWERING)
    # pooler 2*8*8 and classifier 2*8*3 on one token of the s
    assert flops.head_flops(classifier, s) == (128 + 48) / 4
    assert flops.head_flops(qa, s) == 2 * 8 * 2
    assert flops.head_flops(TINY, s) == 128 + 160


def test_encoder_heads_saved_tensors() -> None:
    layout = Layout(micro_batch_size=2)
    training = TrainingSpec(seq_len=4, global_batch_size=2, precision=Precision.FP16)
    t, h = 8, 8  # tokens of the micro-batch, hidden size
    # masked LM: transform's input and output, LayerNorm input (+ fp32 mean and rstd), decoder input;
    # then log_softmax's output over V in the model dtype (no fp32 upcast) and the int64 labels
    mlm = activations.last_stage_extra_bytes(TINY, layout, training)
    assert mlm == 4 * 2 * t * h + 8 * t + 2 * t * 10 + 8 * t
    # question answering: qa_outputs' input, start/end log-probabilities, two positions per sequence
    qa = dataclasses.replace(TINY, head=Head.QUESTION_ANSWERING)
    assert activations.last_stage_extra_bytes(qa, layout, training) == 2 * t * h + 2 * t * 2 + 2 * 8 * 2
    assert activations.loss_workspace_bytes(qa, layout, training) == 2 * 2 * t * 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"is_decoder": True}, "hf_config.is_decoder"),
        ({"add_cross_attention": True}, "hf_config.add_cross_attention"),
        ({"position_embedding_type": "relative_key"}, "hf_config.position_embedding_type"),
        ({"architectures": ["BertForMultipleChoice"]}, "hf_config.architectures"),
        ({"architectures": "BertForMaskedLM"}, "hf_config.architectures"),
    ],
)
def test_what_the_encoder_builder_cannot_express_is_refused(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidModel) as refused:
        model_from_hf_config(TINY_CONFIG | change)
    assert refused.value.field == field


def test_an_encoder_head_needs_a_bidirectional_model_and_the_reverse() -> None:
    with pytest.raises(InvalidModel, match="needs bidirectional"):
        dataclasses.replace(TINY, bidirectional=False)
    with pytest.raises(InvalidModel, match="needs a causal model"):
        dataclasses.replace(TINY, head=Head.CAUSAL_LM)


def test_gpt_only_launchers_refuse_an_encoder() -> None:
    training = TrainingSpec(seq_len=384, global_batch_size=32, precision=Precision.FP16)
    assert "bidirectional encoder" in (megatron.job_refusal(TINY, training) or "")
    assert "bidirectional encoder" in (torchtitan.job_refusal(TINY, training) or "")
    decoder = ModelSpec(
        name="d", num_layers=2, hidden_size=8, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=16,
        vocab_size=10,
    )  # fmt: skip
    assert megatron.job_refusal(decoder, training) is None


MEASURED = json.loads((DATA_DIR / "encoder_activations.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", MEASURED["cases"], ids=lambda c: c["id"])
def test_encoder_activations_match_what_autograd_saved(case: dict[str, Any]) -> None:
    # validation/encoder_activations.py: a tiny BertFor* on the CPU, dropout 0, two depths
    config = MEASURED["config"] | {"num_hidden_layers": 1, "architectures": [case["architecture"]]}
    spec = model_from_hf_config(config)
    precision = Precision.BF16 if case["dtype"] == "bfloat16" else Precision.FP32
    attention = Attention.EAGER if case["attention"] == "eager" else Attention.SDPA
    training = TrainingSpec(
        seq_len=case["seq_len"], global_batch_size=case["batch"], precision=precision, attention=attention
    )
    layout = Layout(micro_batch_size=case["batch"], framework=Framework.FSDP)
    per_layer = activations.hf_layer_bytes(spec, layout, training, False)
    outside = activations.first_stage_extra_bytes(
        spec, layout, training
    ) + activations.last_stage_extra_bytes(spec, layout, training)
    assert per_layer == pytest.approx(case["per_layer_bytes"], rel=0.01)
    assert outside == pytest.approx(case["outside_layers_bytes"], rel=0.05)


def test_an_encoders_flash_kernel_runs_at_the_unmasked_rates() -> None:
    # Shah et al. arXiv:2407.08608 Figures 5-6, without a mask, H100 SXM5 (989.4 TFLOP/s): FA2 forward
    # 309 / backward 214 TFLOP/s at 512, cuDNN 497 / 305; the causal curves are unchanged
    tuning = default_tuning()
    peak = 989.4e12
    fa2 = attention_kernel_fractions(tuning, H100, Framework.FSDP, 512, unmasked=True)
    cudnn = attention_kernel_fractions(tuning, H100, Framework.MEGATRON, 512, unmasked=True)
    assert fa2 is not None and cudnn is not None
    assert (fa2[0] * peak, fa2[1] * peak) == (
        pytest.approx(309e12, rel=0.005),
        pytest.approx(214e12, rel=0.005),
    )
    assert (cudnn[0] * peak, cudnn[1] * peak) == (
        pytest.approx(497e12, rel=0.005),
        pytest.approx(305e12, rel=0.005),
    )
    causal = attention_kernel_fractions(tuning, H100, Framework.FSDP, 512)
    assert causal is not None and causal[0] * peak == pytest.approx(191e12, rel=0.005)
    # a GPU without a stated die takes the slowest published die's curves, unmasked ones too
    rate = conservative_kernel_rate(tuning, "fa2")
    assert rate is not None and rate.forward_unmasked_points


def test_a_bert_step_on_h100_times_its_core_at_the_unmasked_rate() -> None:
    bert = catalog_model("bert-large-uncased").spec
    training = TrainingSpec(
        seq_len=512, global_batch_size=8, precision=Precision.BF16, attention=Attention.SDPA
    )
    layout = Layout(framework=Framework.FSDP, micro_batch_size=8)
    job = make_job(bert, gpu_cluster(H100, 1, 50e9), training, default_tuning())
    kernel = step_time.core_kernel(job, layout)
    assert kernel is not None
    assert kernel.forward_fraction * 989.4e12 == pytest.approx(309e12, rel=0.005)


def test_the_search_offers_an_encoder_data_parallelism_only() -> None:
    training = TrainingSpec(seq_len=384, global_batch_size=32, precision=Precision.FP16)
    for framework in (Framework.FSDP, Framework.DEEPSPEED):
        assert framework_structure_refusal(framework, TINY, training, 1, 1, 1, 1) is None
        for tp, pp, cp in ((2, 1, 1), (1, 2, 1), (1, 1, 2)):
            refusal = framework_structure_refusal(framework, TINY, training, tp, pp, cp, 1)
            assert refusal is not None and "bidirectional encoder" in refusal


def test_an_encoders_lora_config_names_its_own_linears() -> None:
    # peft matches a string target_modules with re.fullmatch against each module name; the names are
    # transformers' BertForSequenceClassification's (checked with peft 0.21 on a tiny model: 6 per layer)
    fields = encoder_lora_fields(Head.SEQUENCE_CLASSIFICATION, ALL_LINEAR)
    assert fields["task_type"] == "SEQ_CLS"
    pattern = str(fields["target_modules"])
    layer = "bert.encoder.layer.11."
    adapted = ["attention.self.query", "attention.self.key", "attention.self.value"]
    adapted += ["attention.output.dense", "intermediate.dense", "output.dense"]
    assert all(re.fullmatch(pattern, layer + name) for name in adapted)
    assert not any(re.fullmatch(pattern, name) for name in ("bert.pooler.dense", "classifier"))
    only_qv = str(encoder_lora_fields(Head.MASKED_LM, ("q_proj", "v_proj"))["target_modules"])
    assert re.fullmatch(only_qv, layer + "attention.self.value")
    assert not re.fullmatch(only_qv, layer + "attention.output.dense")
    assert encoder_lora_fields(Head.MASKED_LM, ALL_LINEAR)["task_type"] is None


def test_the_validator_refuses_an_encoder_split_beyond_data_parallelism() -> None:
    """The launchers refused tp/pp/cp > 1 for encoders, the validator did not: an estimate of BERT at
    tp 2 was answered, its head's weights unsplit while its logits were split over tp."""
    from service.estimator.errors import InvalidLayout
    from service.estimator.validate import validate_layout

    bert = catalog_model("bert-large-uncased").spec
    training = TrainingSpec(seq_len=384, global_batch_size=32)
    for degrees, field in ((dict(dp=4, tp=2), "tp"), (dict(dp=4, pp=2), "pp"), (dict(dp=4, cp=2), "cp")):
        layout = Layout(framework=Framework.DEEPSPEED, **degrees)
        with pytest.raises(InvalidLayout) as refused:
            validate_layout(bert, gpu_cluster(H100, 8, 50e9), layout, training)
        assert refused.value.rule == "encoder_split" and refused.value.field == field
    validate_layout(bert, gpu_cluster(H100, 8, 50e9), Layout(framework=Framework.DEEPSPEED, dp=8), training)


@pytest.mark.parametrize("field", ["moe", "mla"])
def test_an_encoder_with_experts_or_latent_attention_is_refused(field: str) -> None:
    from service.estimator.types import MLASpec, MoESpec

    extra = {
        "moe": MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=64),
        "mla": MLASpec(
            q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16
        ),
    }[field]
    with pytest.raises(InvalidModel) as refused:
        dataclasses.replace(TINY, **{field: extra})
    assert refused.value.field == field and refused.value.rule == "encoder"


def test_lora_on_the_gate_alone_of_a_model_without_one_is_refused() -> None:
    """peft refuses a LoraConfig that matches no module; BERT's and GPT-2's MLPs have no gate."""
    from service.estimator.errors import InvalidLayout
    from service.estimator.types import Method
    from service.estimator.validate import validate_layout

    # 4 tokens: within TINY's 6 learned positions
    training = TrainingSpec(seq_len=4, global_batch_size=8, method=Method.LORA, lora_targets=("gate_proj",))
    with pytest.raises(InvalidLayout) as refused:
        validate_layout(TINY, gpu_cluster(H100, 1, 50e9), Layout(framework=Framework.DEEPSPEED), training)
    assert refused.value.field == "lora_targets" and "gate projection" in refused.value.message


def test_chunked_loss_is_refused_where_there_is_no_vocabulary_to_chunk() -> None:
    """A classifier's num_labels logits: chunked_loss changed nothing of its estimate and was accepted
    (small-model review, stop 41); a masked LM's vocabulary it does chunk."""
    from service.estimator.errors import InvalidLayout
    from service.estimator.validate import validate_layout

    classifier = dataclasses.replace(TINY, head=Head.SEQUENCE_CLASSIFICATION, num_labels=3)
    training = TrainingSpec(seq_len=4, global_batch_size=8)
    chunked = Layout(framework=Framework.FSDP, chunked_loss=True)
    with pytest.raises(InvalidLayout, match="chunked_loss") as refused:
        validate_layout(classifier, gpu_cluster(H100, 1, 50e9), chunked, training)
    assert refused.value.field == "chunked_loss"
    validate_layout(TINY, gpu_cluster(H100, 1, 50e9), chunked, training)  # masked LM: its vocabulary


def test_a_token_classifiers_saved_tensors_by_hand() -> None:
    """BertForTokenClassification: dropout on every token's last hidden state (its 1-byte mask and
    output, the classifier's input), an int64 label per token."""
    spec = model_from_hf_config(TINY_CONFIG | {"architectures": ["BertForTokenClassification"]})
    training = TrainingSpec(seq_len=4, global_batch_size=2, precision=Precision.FP16)
    layout = Layout(framework=Framework.DEEPSPEED, micro_batch_size=2)
    tokens = 8  # 2 sequences of 4
    assert activations.encoder_head_bytes(spec, layout, training) == (1 + 2) * tokens * 8
    assert activations.encoder_label_bytes(spec, tokens, training) == 8 * tokens
    assert activations.loss_logits_per_token(spec, 4) == 2  # num_labels logits per token
