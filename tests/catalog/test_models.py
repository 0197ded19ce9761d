"""Model catalog: the presets of the newer families resolve to their meta-device counts, and
``null_keys`` restores the JSON nulls TOML cannot write."""

from __future__ import annotations

from typing import Any

import pytest

from service.catalog.errors import InvalidCatalogEntry
from service.catalog.models import _preset, model, models
from service.estimator.params import parameter_counts
from service.estimator.types import AttentionKind

# sum(p.numel() for p in model.parameters()) of AutoModelForCausalLM.from_config(config) on the meta
# device, transformers 5.24 (multimodal models: the language model of text_config); the same
# numbers are in validation/data/param_counts.json.
META_DEVICE_TOTALS = {
    "qwen3-0.6b": 596_049_920,
    "qwen3-8b": 8_190_735_360,
    "qwen3-14b": 14_768_307_200,
    "qwen3-32b": 32_762_123_264,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560,
    "deepseek-v2-lite": 15_706_484_224,
    "deepseek-v2": 235_741_434_880,
    "deepseek-v3": 671_026_404_352,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b": 999_885_952,
    "gemma-3-12b": 11_766_034_176,
    "gemma-3-27b": 27_009_346_304,
    "llama-4-scout-17b-16e": 107_769_861_120,
    "llama-4-maverick-17b-128e": 400_711_848_960,
    "gpt-oss-20b": 20_914_757_184,
    "gpt-oss-120b": 116_829_156_672,
    "olmo-2-7b": 7_298_617_344,
    "olmo-2-13b": 13_716_198_400,
    "olmo-2-32b": 32_234_279_936,
    "granite-3.3-8b": 8_170_864_640,
    "phi-4": 14_659_507_200,
    "mistral-nemo-12b": 12_247_782_400,
    "mistral-small-24b": 23_572_403_200,
    "smollm2-1.7b": 1_711_376_384,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.3-70b": 70_553_706_496,
}


@pytest.mark.parametrize(("slug", "expected"), META_DEVICE_TOTALS.items())
def test_preset_total_is_the_meta_device_count(slug: str, expected: int) -> None:
    preset = model(slug)
    assert parameter_counts(preset.spec).total == expected
    assert preset.source.startswith("https://huggingface.co/") and "config.json" in preset.source


def test_every_preset_slug_is_lowercase_with_dashes() -> None:
    assert all(slug == slug.lower() and " " not in slug and "_" not in slug for slug in models())


def test_null_keys_become_none() -> None:
    lite = model("deepseek-v2-lite")
    assert "q_lora_rank" in lite.config and lite.config["q_lora_rank"] is None
    assert lite.spec.mla is not None and lite.spec.mla.q_lora_rank is None  # plain q_proj
    for slug in ("mistral-nemo-12b", "mistral-small-24b"):
        preset = model(slug)
        assert preset.config["sliding_window"] is None
        assert preset.spec.layer_types == () and preset.spec.sliding_window is None
    # Mistral 7B's explicit window covers every layer
    assert set(model("mistral-7b").spec.layer_types) == {AttentionKind.SLIDING}


TABLE: dict[str, Any] = {
    "display_name": "T",
    "source": "https://example.org/config.json",
    "config": {
        "model_type": "mistral3",
        "text_config": {
            "model_type": "mistral",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 100,
        },
    },
}


def test_null_keys_reach_nested_tables() -> None:
    preset = _preset("t", {**TABLE, "null_keys": ["text_config.sliding_window"]})
    assert preset.config["text_config"]["sliding_window"] is None
    assert preset.spec.layer_types == ()
    without = _preset("t", TABLE)
    assert "sliding_window" not in without.config["text_config"]
    assert set(without.spec.layer_types) == {AttentionKind.SLIDING}  # MistralConfig's 4096


@pytest.mark.parametrize(
    "null_keys",
    [
        "sliding_window",  # not a list
        [""],
        ["text_config.model_type"],  # set and null at once
        ["vision_config.hidden_size"],  # no such table
        ["model_type.x"],  # not a table
    ],
)
def test_bad_null_keys_are_refused(null_keys: object) -> None:
    with pytest.raises(InvalidCatalogEntry) as info:
        _preset("t", {**TABLE, "null_keys": null_keys})
    assert (info.value.entry, info.value.key) == ("t", "null_keys")
