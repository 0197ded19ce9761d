"""Catalog entries by the names users write (``service.catalog.names``): the slug, the published name
in any case and spacing, a Hugging Face repo id, or words only one entry carries. Names that several
entries carry are refused with those entries; a model's words must state its size."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.catalog.errors import UnknownCatalogEntry
from service.catalog.gpus import gpu_entries, gpu_entry
from service.catalog.models import model, models
from service.catalog.names import normalised, resolve, words

ALIASES = {
    "h100-sxm-80gb": ("NVIDIA H100 SXM5 80GB",),
    "h100-pcie-80gb": ("NVIDIA H100 PCIe 80GB",),
    "rtx-4090-24gb": ("NVIDIA GeForce RTX 4090",),
    "l40-48gb": ("NVIDIA L40",),
    "l40s-48gb": ("NVIDIA L40S",),
}


def test_normalised_and_words() -> None:
    assert normalised("  H100 SXM5_80GB ") == "h100-sxm5-80gb"
    read = words("NVIDIA H100 SXM5 96GB, 500 W (Grand Teton)")
    assert read == {"h100", "sxm5", "96gb", "500", "w", "grand", "teton"}
    assert words("meta-llama/Llama-3.1-8B") == {"meta", "llama", "3.1", "8b"}


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("h100-sxm-80gb", "h100-sxm-80gb"),  # the slug
        ("H100-SXM-80GB", "h100-sxm-80gb"),  # case
        ("nvidia h100 sxm5 80gb", "h100-sxm-80gb"),  # the published name
        ("4090", "rtx-4090-24gb"),  # a word only it carries
        ("l40", "l40-48gb"),  # a whole word: not l40s
        ("L40S", "l40s-48gb"),
    ],
)
def test_names_resolve_to_one_slug(name: str, slug: str) -> None:
    assert resolve("gpu", name, ALIASES) == slug


def test_words_several_carry_are_ambiguous() -> None:
    with pytest.raises(UnknownCatalogEntry) as caught:
        resolve("gpu", "H100 80GB", ALIASES)
    assert caught.value.ambiguous
    assert caught.value.candidates == ("h100-pcie-80gb", "h100-sxm-80gb")
    assert "it matches 2 entries: h100-pcie-80gb, h100-sxm-80gb; name one" in str(caught.value)


def test_no_match_suggests_the_closest_slugs() -> None:
    with pytest.raises(UnknownCatalogEntry) as caught:
        resolve("gpu", "rtx4090", ALIASES)
    assert not caught.value.ambiguous
    assert caught.value.candidates[0] == "rtx-4090-24gb"
    assert "did you mean rtx-4090-24gb" in str(caught.value)


def test_a_size_word_must_be_named() -> None:
    size = re.compile(r"^\d+b$")
    aliases = {"mixtral-8x7b": (), "llama-2-7b": ()}
    assert resolve("model", "llama 7b", aliases, size) == "llama-2-7b"
    with pytest.raises(UnknownCatalogEntry) as caught:
        resolve("model", "llama-2", aliases, size)  # one preset carries it, but not its size
    assert caught.value.candidates == ("llama-2-7b",) and not caught.value.ambiguous


# ------------------------------------------------------------- over the whole catalogs


def test_every_gpu_slug_published_name_and_alias_reads_as_itself() -> None:
    for entry in gpu_entries():
        for name in (
            entry.name,
            entry.name.upper(),
            entry.display_name,
            entry.display_name.lower(),
            *entry.aliases,
        ):
            assert gpu_entry(name).name == entry.name, name


@pytest.mark.parametrize(
    ("name", "slug"),
    [  # as nvidia-smi (NVML) and rocm-smi report them: what a user copies from the node
        ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
        ("NVIDIA H100 NVL", "h100-nvl-94gb"),
        ("NVIDIA H200", "h200-sxm-141gb"),
        ("NVIDIA B200", "b200-sxm-180gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("Tesla T4", "t4-16gb"),
        ("NVIDIA A10G", "a10g-24gb"),
        ("NVIDIA L4", "l4-24gb"),
        ("NVIDIA L40S", "l40s-48gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090-24gb"),
        ("AMD Instinct MI300X", "mi300x-192gb"),
    ],
)
def test_gpu_names_as_the_driver_reports_them(name: str, slug: str) -> None:
    assert gpu_entry(name).name == slug


def test_every_preset_slug_published_name_and_repo_reads_as_itself() -> None:
    repos: dict[str, list[str]] = {}
    for preset in models().values():
        found = re.match(r"https://huggingface\.co/([^/]+/[^/]+)/", preset.source)
        if found:
            repos.setdefault(found.group(1).lower(), []).append(preset.name)
    for preset in models().values():
        assert model(preset.name).name == preset.name
        assert model(preset.name.upper()).name == preset.name
        assert model(preset.display_name).name == preset.name, preset.display_name
    for repo, slugs in repos.items():
        if len(slugs) == 1:  # a repo two presets share (a paper's shape on one config) names neither
            assert model(repo).name == slugs[0], repo


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b"),  # the repo's former name: its words
        ("Llama 3.1 8B", "llama-3.1-8b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ],
)
def test_model_names_users_write(name: str, slug: str) -> None:
    assert model(name).name == slug


@pytest.mark.parametrize(
    ("name", "candidates", "ambiguous"),
    [
        ("llama-70b", ("llama-2-70b", "llama-3-70b", "llama-3.1-70b", "llama-3.3-70b"), True),
        ("mixtral", ("mixtral-8x7b",), False),  # one Mixtral, but the name states no size
        ("gpt-3", ("gpt-3-175b",), False),
    ],
)
def test_model_names_that_do_not_select_one_preset(
    name: str, candidates: tuple[str, ...], ambiguous: bool
) -> None:
    with pytest.raises(UnknownCatalogEntry) as caught:
        model(name)
    assert (caught.value.candidates, caught.value.ambiguous) == (candidates, ambiguous)


def test_an_unknown_model_says_how_to_plan_it_anyway() -> None:
    with pytest.raises(UnknownCatalogEntry) as caught:
        model("Qwen/Qwen2.5-14B")  # not a preset: the service fetches no config.json
    assert "send its config.json as model.hf_config" in str(caught.value)


# ------------------------------------------------------------- spellings, generated (hypothesis shrinks)

_ENTRIES = [(entry.name, entry.display_name) for entry in gpu_entries()] + [
    (preset.name, preset.display_name) for preset in models().values()
]


@st.composite
def _respelled(draw: st.DrawFn) -> tuple[str, str]:
    """A catalog entry's slug or published name as someone might type it: any case per letter, its
    separators as hyphens, spaces or underscores, spaces around it."""
    slug, display = draw(st.sampled_from(_ENTRIES))
    name = draw(st.sampled_from([slug, display]))
    out = []
    for char in name:
        if char in "- _":
            out.append(draw(st.sampled_from(["-", " ", "_"])))
        elif char.isalpha():
            out.append(char.upper() if draw(st.booleans()) else char.lower())
        else:
            out.append(char)
    pad = draw(st.sampled_from(["", " ", "  "]))
    return slug, pad + "".join(out) + pad


@settings(max_examples=300, deadline=None)
@given(case=_respelled())
def test_any_casing_and_separators_of_a_name_read_as_its_entry(case: tuple[str, str]) -> None:
    slug, typed = case
    found = gpu_entry(typed).name if slug in {e.name for e in gpu_entries()} else model(typed).name
    assert found == slug, typed


@pytest.mark.parametrize("name", ["AMD Instinct MI300X OAM", "AMD Instinct MI300X VF", "MI300X OAM"])
def test_the_names_amds_tools_print_are_the_mi300x(name: str) -> None:
    """rocm-smi's card series and rocminfo's name on SR-IOV hosts were 422s (AMD review)."""
    from service.catalog.gpus import gpu

    assert gpu(name).name == "mi300x-192gb"


def test_amds_memory_tools_name_the_device_used_statistic() -> None:
    from service.contracts.common import ENUM_SPELLINGS

    assert (
        ENUM_SPELLINGS["rocm_smi"]
        == ENUM_SPELLINGS["amd_smi"]
        == ENUM_SPELLINGS["nvidia_smi"]
        == "device_used"
    )
