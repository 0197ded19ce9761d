"""GPU catalog: every promised slug loads, units are sane, datasheet spot checks, strict schema."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from service.catalog.errors import InvalidCatalogEntry, UnknownCatalogEntry
from service.catalog.gpus import GPUEntry, _parse_gpus, gpu, gpu_entries, gpu_entry, gpus
from service.estimator.types import GPUSpec

GiB = 2**30

# The slugs the API contract (design/api.md) and clients rely on.
REQUIRED_SLUGS = (
    "h100-sxm-80gb",
    "h100-pcie-80gb",
    "h200-sxm-141gb",
    "b200-sxm-180gb",
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "a10-24gb",
    "a10g-24gb",
    "l4-24gb",
    "l40s-48gb",
    "l40-48gb",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "rtx-3090-24gb",
    "rtx-4090-24gb",
    "mi250x-gcd-64gb",
    "mi300x-192gb",
)

# Parts whose intra-node figure is NVLink / Infinity Fabric rather than PCIe, at least 4x the host
# link. (An MI250X GCD's weakest peer link, 50 GB/s, is not: its host link is Infinity Fabric too.)
FABRIC_LINKED = (
    "h100-sxm-80gb",
    "h200-sxm-141gb",
    "b200-sxm-180gb",
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "mi300x-192gb",
)

ALL_ENTRIES = gpu_entries()
IDS = [entry.name for entry in ALL_ENTRIES]

VALID_ENTRY = """
[test-gpu-16gb]
display_name = "Test GPU 16GB"
vendor = "nvidia"
chip = "test-die"
memory_bytes = 17_179_869_184
peak_fp32_flops_per_s = 10e12
peak_bf16_flops_per_s = 100e12
hbm_bandwidth_bytes_per_s = 1e12
intra_node_bandwidth_bytes_per_s = 32e9
pcie_bandwidth_bytes_per_s = 32e9
source = "made up for the test"
"""


def test_every_required_slug_is_present() -> None:
    missing = [slug for slug in REQUIRED_SLUGS if slug not in gpus()]
    assert missing == []


def test_catalog_keeps_file_order_and_names_match() -> None:
    catalog = gpus()
    assert list(catalog) == IDS
    assert next(iter(catalog)) == "h100-sxm-80gb"
    for name, spec in catalog.items():
        assert spec.name == name
        assert isinstance(spec, GPUSpec)


def test_gpus_returns_a_fresh_dict() -> None:
    gpus().clear()
    assert "h100-sxm-80gb" in gpus()


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=IDS)
def test_every_entry_cites_a_source(entry: GPUEntry) -> None:
    assert entry.source.strip()
    assert entry.spec.source == entry.source
    assert entry.display_name.strip()


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=IDS)
def test_slug_states_the_memory_in_gib(entry: GPUEntry) -> None:
    # "80gb" means 80 GiB, the vendors' binary reading (see the header of gpus.toml).
    assert entry.name.endswith(f"-{entry.nominal_memory_bytes // GiB}gb")
    assert entry.nominal_memory_bytes % GiB == 0
    # what a process sees: all of it, or 15/16 where GDDR6's ECC keeps its check bits in it
    assert entry.spec.memory_bytes in (entry.nominal_memory_bytes, entry.nominal_memory_bytes * 15 // 16)


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=IDS)
def test_units_are_sane(entry: GPUEntry) -> None:
    spec = entry.spec
    peaks = spec.peak_flops_per_s
    assert 8e9 <= spec.memory_bytes <= 300e9
    assert 1e12 <= peaks.fp32 <= 2e14  # FLOP/s, not TFLOPS
    half = peaks.bf16 or peaks.fp16
    assert half is not None
    assert 1e13 <= half <= 5e15
    assert half > peaks.fp32
    if peaks.bf16 is not None and peaks.fp16 is not None:
        assert peaks.bf16 == peaks.fp16
    if peaks.tf32 is not None:
        assert peaks.fp32 <= peaks.tf32 <= half
    if peaks.fp8 is not None:
        assert peaks.fp8 >= half
    assert 1e11 <= spec.hbm_bandwidth_bytes_per_s <= 2e13  # bytes/s, not GB/s
    assert 1e10 <= spec.pcie_bandwidth_bytes_per_s <= 1.3e11
    assert spec.intra_node_bandwidth_bytes_per_s >= spec.pcie_bandwidth_bytes_per_s
    assert entry.vendor == spec.vendor
    assert entry.vendor in {"nvidia", "amd"}


@pytest.mark.parametrize("name", FABRIC_LINKED)
def test_fabric_links_beat_pcie(name: str) -> None:
    spec = gpu(name)
    assert spec.intra_node_bandwidth_bytes_per_s > 4 * spec.pcie_bandwidth_bytes_per_s


def test_precisions_a_chip_lacks_are_absent() -> None:
    v100 = gpu("v100-sxm2-32gb").peak_flops_per_s
    assert (v100.tf32, v100.bf16, v100.fp8) == (None, None, None)
    assert gpu("a100-sxm-80gb").peak_flops_per_s.fp8 is None
    mi250x = gpu("mi250x-gcd-64gb").peak_flops_per_s
    assert (mi250x.tf32, mi250x.fp8) == (None, None)


def test_h100_sxm_datasheet() -> None:
    spec = gpu("h100-sxm-80gb")
    # H100 whitepaper: 132 SMs x 4 tensor cores x 1024 dense bf16 FLOP/clk x 1.83 GHz = 989.4 TFLOPS
    # (the datasheet's 1,979* is 2:4 sparse).
    assert spec.peak_flops_per_s.bf16 == pytest.approx(132 * 4 * 1024 * 1.83e9, rel=1e-3)
    assert spec.peak_flops_per_s.bf16 == pytest.approx(989.4e12)
    assert spec.peak_flops_per_s.fp8 == pytest.approx(1978.9e12)  # datasheet 3,958* sparse
    assert spec.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)  # HBM3, 3.35 TB/s
    assert spec.intra_node_bandwidth_bytes_per_s == pytest.approx(450e9)  # NVLink4 900 GB/s bidir
    assert spec.memory_bytes == 80 * GiB  # nvidia-smi shows 81559 MiB of it
    assert spec.memory_bytes > 81559 * 2**20


def test_a100_datasheet() -> None:
    for name in ("a100-sxm-40gb", "a100-sxm-80gb"):
        peaks = gpu(name).peak_flops_per_s
        assert peaks.bf16 == pytest.approx(312e12)  # datasheet 312 | 624* TFLOPS
        assert peaks.tf32 == pytest.approx(156e12)  # datasheet 156 | 312* TFLOPS
        assert gpu(name).intra_node_bandwidth_bytes_per_s == pytest.approx(300e9)  # NVLink3 600 bidir
    assert gpu("a100-sxm-80gb").hbm_bandwidth_bytes_per_s == pytest.approx(2.039e12)  # 2,039 GB/s
    assert gpu("a100-sxm-40gb").hbm_bandwidth_bytes_per_s == pytest.approx(1.555e12)  # 1,555 GB/s


def test_v100_datasheet() -> None:
    spec = gpu("v100-sxm2-16gb")
    assert spec.peak_flops_per_s.fp16 == pytest.approx(125e12)  # V100 SXM2 tensor: 125 TFLOPS
    assert spec.intra_node_bandwidth_bytes_per_s == pytest.approx(150e9)  # NVLink2 300 GB/s bidir


def test_big_parts_datasheets() -> None:
    h200 = gpu("h200-sxm-141gb")
    assert h200.hbm_bandwidth_bytes_per_s == pytest.approx(4.8e12)  # HBM3e 4.8 TB/s
    assert h200.peak_flops_per_s == gpu("h100-sxm-80gb").peak_flops_per_s  # same GH100 SXM5 compute
    b200 = gpu("b200-sxm-180gb")
    assert b200.peak_flops_per_s.bf16 == pytest.approx(2.25e15)  # HGX B200: 4.5* PFLOPS sparse
    assert b200.peak_flops_per_s.fp8 == pytest.approx(4.5e15)  # HGX B200: 9* PFLOPS sparse
    assert b200.intra_node_bandwidth_bytes_per_s == pytest.approx(900e9)  # NVLink5 1.8 TB/s bidir
    mi300x = gpu("mi300x-192gb")
    assert mi300x.peak_flops_per_s.bf16 == pytest.approx(1307.4e12)  # AMD data sheet, dense
    assert mi300x.hbm_bandwidth_bytes_per_s == pytest.approx(5.3e12)
    assert mi300x.memory_bytes == 192 * GiB


def test_a10g_is_never_faster_than_the_a10() -> None:
    """AWS's A10G (G5 instances) has no NVIDIA datasheet: the same die, memory and links as the A10
    (GA102, 24 GiB GDDR6 at 600 GB/s, PCIe Gen4, no NVLink), and the tensor peaks at GA102's
    FP32-accumulate half rate, never above the A10's (gpus.toml says why)."""
    a10g, a10 = gpu("a10g-24gb"), gpu("a10-24gb")
    # 24 GiB of GDDR6, 1/16 of it ECC's (nvidia-smi 23028 MiB on an A10)
    assert (a10g.chip, a10g.memory_bytes, a10g.hbm_bandwidth_bytes_per_s) == (
        "ga102",
        24 * GiB * 15 // 16,
        600e9,
    )
    assert a10g.memory_bytes == a10.memory_bytes
    assert a10g.intra_node_bandwidth_bytes_per_s == a10g.pcie_bandwidth_bytes_per_s == 32e9  # PCIe only
    assert (a10g.peak_flops_per_s.bf16, a10g.peak_flops_per_s.fp16, a10g.peak_flops_per_s.tf32) == (
        70e12,
        70e12,
        35e12,
    )
    assert a10g.peak_flops_per_s.fp8 is None  # Ampere
    for field in ("fp32", "tf32", "bf16", "fp16"):
        assert getattr(a10g.peak_flops_per_s, field) <= getattr(a10.peak_flops_per_s, field)
    assert gpu_entry("a10g-24gb").spec.node_gpus is None  # a PCIe card: the request's node size


def test_l40_datasheet_beside_the_l40s() -> None:
    """NVIDIA's L40 datasheet prints the L40 next to the L40S: the same AD102, memory and PCIe Gen4
    link, dense tensor peaks half the L40S's (the sparse figures halved), no NVLink."""
    l40, l40s = gpu("l40-48gb"), gpu("l40s-48gb")
    peaks = l40.peak_flops_per_s
    assert (peaks.fp32, peaks.tf32, peaks.bf16, peaks.fp16, peaks.fp8) == (
        90.5e12,
        90.5e12,
        181.05e12,
        181.05e12,
        362e12,
    )
    assert peaks.bf16 is not None and l40s.peak_flops_per_s.bf16 is not None
    assert math.isclose(peaks.bf16, l40s.peak_flops_per_s.bf16 / 2, rel_tol=1e-3)  # 181.05 vs 362.05
    assert (l40.chip, l40.memory_bytes, l40.hbm_bandwidth_bytes_per_s) == (
        l40s.chip,
        l40s.memory_bytes,
        l40s.hbm_bandwidth_bytes_per_s,
    )
    assert l40.intra_node_bandwidth_bytes_per_s == l40.pcie_bandwidth_bytes_per_s == 32e9


def test_gpu_entry_carries_listing_fields() -> None:
    entry = gpu_entry("rtx-4090-24gb")
    assert entry.display_name == "NVIDIA GeForce RTX 4090 24GB"
    assert entry.vendor == "nvidia"
    assert entry.notes is not None and "accumulate" in entry.notes
    assert gpu_entry("h100-sxm-80gb").notes is None


def test_unknown_gpu_lists_known_names() -> None:
    with pytest.raises(UnknownCatalogEntry) as caught:
        gpu("nope")
    error = caught.value
    assert isinstance(error, LookupError)
    assert (error.kind, error.name) == ("gpu", "nope")
    assert error.known == tuple(sorted(gpus()))
    assert str(error).startswith(
        "unknown gpu 'nope'; a GPU outside the catalog: describe it from its datasheet"
    )
    assert "--gpu-spec FILE" in str(error) and "(known: a10-24gb, a100-pcie-40gb, " in str(error)
    assert 'vendor "amd" for an AMD part' in str(error)  # left out with chip, NVIDIA's is assumed
    assert "h100-sxm-80gb" in str(error)


def test_a_name_several_gpus_carry_lists_them() -> None:
    with pytest.raises(UnknownCatalogEntry) as caught:
        gpu("h100")
    error = caught.value
    assert error.ambiguous
    assert error.candidates == ("h100-nvl-94gb", "h100-pcie-80gb", "h100-sxm-500w-96gb", "h100-sxm-80gb")
    assert str(error).startswith("unknown gpu 'h100'; it matches 4 entries: h100-nvl-94gb, ")
    assert "outside the catalog" not in str(error)  # it is in the catalog, four times


def test_unknown_gpu_entry_raises_too() -> None:
    with pytest.raises(UnknownCatalogEntry, match="unknown gpu 'nope'"):
        gpu_entry("nope")


def test_parse_accepts_a_minimal_entry() -> None:
    (entry,) = _parse_gpus(VALID_ENTRY).values()
    assert entry.name == "test-gpu-16gb"
    assert entry.notes is None
    assert entry.spec.chip == "test-die"
    assert entry.spec.peak_flops_per_s.tf32 is None
    assert math.isclose(entry.spec.peak_flops_per_s.bf16 or 0.0, 100e12)


def test_parse_rejects_unknown_key() -> None:
    text = VALID_ENTRY + "peak_bf16_tflops = 100\n"
    with pytest.raises(InvalidCatalogEntry) as caught:
        _parse_gpus(text)
    error = caught.value
    assert (error.kind, error.entry, error.key) == ("gpu", "test-gpu-16gb", "peak_bf16_tflops")
    assert "'test-gpu-16gb'" in str(error)
    assert "'peak_bf16_tflops'" in str(error)


def test_parse_rejects_missing_source() -> None:
    text = VALID_ENTRY.replace('source = "made up for the test"\n', "")
    with pytest.raises(InvalidCatalogEntry, match=r"gpu 'test-gpu-16gb': missing required key 'source'"):
        _parse_gpus(text)


def test_parse_rejects_blank_source() -> None:
    text = VALID_ENTRY.replace('"made up for the test"', '"  "')
    with pytest.raises(InvalidCatalogEntry, match=r"'test-gpu-16gb'.*source") as caught:
        _parse_gpus(text)
    assert caught.value.key == "source"


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("memory_bytes = 17_179_869_184", "memory_bytes = 16.0e9", "memory_bytes"),
        ("memory_bytes = 17_179_869_184", 'memory_bytes = "16GB"', "memory_bytes"),
        (
            "pcie_bandwidth_bytes_per_s = 32e9",
            "pcie_bandwidth_bytes_per_s = true",
            "pcie_bandwidth_bytes_per_s",
        ),
        ("pcie_bandwidth_bytes_per_s = 32e9", "pcie_bandwidth_bytes_per_s = 0", "pcie_bandwidth_bytes_per_s"),
        ("peak_bf16_flops_per_s = 100e12", "peak_bf16_flops_per_s = -1.0", "peak_bf16_flops_per_s"),
        ('vendor = "nvidia"', 'vendor = "NVIDIA"', "vendor"),
    ],
)
def test_parse_rejects_bad_values_naming_the_key(old: str, new: str, key: str) -> None:
    text = VALID_ENTRY.replace(old, new)
    assert text != VALID_ENTRY
    with pytest.raises(InvalidCatalogEntry) as caught:
        _parse_gpus(text)
    assert (caught.value.entry, caught.value.key) == ("test-gpu-16gb", key)
    assert key in str(caught.value)


def test_parse_rejects_bad_slug_and_bad_toml() -> None:
    with pytest.raises(InvalidCatalogEntry, match="lowercase slug"):
        _parse_gpus(VALID_ENTRY.replace("[test-gpu-16gb]", "[Test_GPU]"))
    with pytest.raises(InvalidCatalogEntry, match="not valid TOML"):
        _parse_gpus("[broken\n")
    with pytest.raises(InvalidCatalogEntry, match="expected a table"):
        _parse_gpus("loose-key = 1\n")
    with pytest.raises(InvalidCatalogEntry, match="no entries"):
        _parse_gpus("# nothing\n")


def test_catalog_imports_no_web_or_db_stack() -> None:
    # The catalog turns data into estimator types; the web shell is above it (design 4.1).
    code = (
        "import sys, service.catalog.gpus as g; g.gpus(); "
        "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'pydantic') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_reference_node_networks_are_their_nics_over_their_gpus() -> None:
    # each GPU's share, one direction: NICs x Gb/s / 8 bits / GPUs of the node
    shares = {
        "h100-sxm-80gb": 8 * 400e9 / 8 / 8,  # DGX H100: 8 x ConnectX-7 400 Gb/s
        "h200-sxm-141gb": 8 * 400e9 / 8 / 8,
        "b200-sxm-180gb": 8 * 400e9 / 8 / 8,
        "a100-sxm-80gb": 8 * 200e9 / 8 / 8,  # DGX A100: 8 x ConnectX-6 200 Gb/s
        "v100-sxm2-32gb": 4 * 100e9 / 8 / 8,  # DGX-1: 4 x EDR 100 Gb/s
        "mi250x-gcd-64gb": 4 * 200e9 / 8 / 8,  # Frontier: 4 x Slingshot 200 Gb/s for 8 GCDs
        "mi300x-192gb": 8 * 400e9 / 8 / 8,  # Azure ND MI300X v5: 8 x NDR 400 Gb/s for 8 GPUs
    }
    for name, share in shares.items():
        assert gpu(name).node_network_bytes_per_s == share, name
    for entry in gpu_entries():  # a network describes a node: only parts that ship in one have it
        assert entry.spec.node_network_bytes_per_s is None or entry.spec.node_gpus is not None
