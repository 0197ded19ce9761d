"""GPUs: the catalog's entries, and a GPU given by catalog name or as a custom spec."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from service.catalog.errors import UnknownCatalogEntry
from service.catalog.gpus import PCIE_X16, GPUEntry, known_chips, slowest_host_link
from service.catalog.gpus import gpu as catalog_gpu
from service.catalog.gpus import gpu_entry as catalog_gpu_entry
from service.catalog.gpus import gpus as catalog_gpus
from service.contracts.common import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_FLOPS_PER_S,
    MAX_MEMORY_BYTES,
    MIN_BANDWIDTH_BYTES_PER_S,
    MIN_FLOPS_PER_S,
    MIN_MEMORY_BYTES,
    FieldError,
    Strict,
    StrictFields,
)
from service.errors import Unprocessable
from service.estimator.errors import InvalidHardware
from service.estimator.types import CUSTOM_GPU_SOURCE, GPUSpec, PeakFlops

MIN_POWER_W, MAX_POWER_W = 1.0, 10_000.0  # a board power outside these is a typo (a B200 is 1,000 W)
MIN_CLOCK_HZ, MAX_CLOCK_HZ = 1e8, 1e10  # 100 MHz to 10 GHz


class PeakFlopsIn(Strict):
    fp32: float = Field(ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)
    tf32: float | None = Field(default=None, ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)
    bf16: float | None = Field(default=None, ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)
    fp16: float | None = Field(
        default=None,
        ge=MIN_FLOPS_PER_S,
        le=MAX_FLOPS_PER_S,
        # PyTorch's fp16 matmuls accumulate in fp32: a GeForce datasheet's fp16-accumulate figure (RTX
        # 4090: 330 against 165 TFLOP/s) is never reached, and above bf16's it would choose fp16 training
        description="dense, with fp32 accumulate (PyTorch's matmuls; GeForce datasheets also print an "
        "fp16-accumulate figure twice as high, which training never reaches)",
    )
    fp8: float | None = Field(default=None, ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)


# The validation context of a stored row read back: rules added after it was written let it through
# (``ClusterShape._mesh_of_stated_links``), where a request is refused
STORED: dict[str, bool] = {"stored": True}


class CustomGPU(StrictFields):  # in a union with str: no model validator (StrictFields)
    """A GPU that is not in the catalog (peaks dense, not sparse). Its link bandwidths may be left out:
    they then resolve from the hardware, never faster than a catalog part of the same die."""

    name: str = Field(min_length=1, max_length=100)
    chip: str | None = Field(
        default=None,
        max_length=32,
        description="the GPU die, one of the catalog's chips: gh100 for an H800, H20 or GH200, ga100 for an "
        "A800 or A30, ad102 for an L20 or RTX 6000 Ada, gb100 for a B100 or GB200 (gpus.toml lists more), "
        "in any case, or a catalog GPU's name, read as its parts' die (\"H100\": gh100); "
        "picks the efficiency fitted on that silicon. Absent: the most conservative fitted efficiency "
        "(the lowest GEMM peak fraction of any die, attention at its kernel's slowest published rate), "
        "with a warning, so the part is never estimated faster than a catalog part with the same peaks.",
    )
    memory_bytes: int = Field(
        ge=MIN_MEMORY_BYTES,
        le=MAX_MEMORY_BYTES,
        description="the memory the fit compares the device memory used with: as the catalog states its "
        "parts, the capacity sold in GiB (an 80 GB card's 80 x 2^30), less the 1/16 GDDR6's ECC keeps "
        "where it is on (an L20's 46068 MiB, as nvidia-smi shows)",
    )
    peak_flops_per_s: PeakFlopsIn
    hbm_bandwidth_bytes_per_s: float = Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S)
    intra_node_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_BYTES_PER_S,
        le=MAX_BANDWIDTH_BYTES_PER_S,
        description="per GPU, one direction, to its peers in the node (NVLink 4: 450e9). Absent: the "
        "PCIe host link (pcie_bandwidth_bytes_per_s), as a GPU without NVLink reaches its peers; never the "
        "NVLink figure of a catalog part of its die, since one die ships both ways (gh100: H100 SXM 450e9, "
        "H100 PCIe 64e9). Not used on a node of one GPU; the answer's assumptions state the figure used",
    )
    pcie_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_BYTES_PER_S,
        le=MAX_BANDWIDTH_BYTES_PER_S,
        description="the host link, one direction (PCIe Gen4 x16: 32e9, Gen5 x16: 64e9); offload crosses "
        "it. Absent: the slowest host link of the catalog's parts of its chip (gh100: 64e9), or of any "
        "catalog part where chip is absent (PCIe Gen3 x16, 16e9); the answer's assumptions state it",
    )
    flash_attention: bool | None = Field(
        default=None,
        description="FlashAttention-2 kernels exist for it (NVIDIA Ampere or newer, AMD CDNA 2/3). Absent: "
        "as the catalog's parts of its chip have them (gv100 and tu104 do not), or, without a chip, "
        "whether it has a bf16 peak (every part with those kernels has one; an AMD part's as fast as "
        "its fp16, which CDNA 1, the MI100, lacks); the attention default "
        "follows (training.attention in resolved_defaults). True on a die without them (gv100, tu104) is "
        "refused",
    )
    vendor: Literal["nvidia", "amd"] | None = Field(
        default=None,
        description="who makes it: the Kubernetes resource its pods ask for (nvidia.com/gpu, amd.com/gpu) "
        "and ROCm's settings in the launch files follow. Absent: its chip's (cdna2, cdna3: amd), else "
        "nvidia",
    )
    peer_to_peer: bool = Field(
        default=True,
        description="CUDA peer access between the GPUs of a node (NVLink, or PCIe peer-to-peer): false where "
        "the driver turns it off (GeForce RTX 4090; RTX 3090 without its NVLink bridge), which rules out TP "
        "communication overlap (layout.tp_comm_overlap: Transformer Engine's userbuffers, torchtitan's "
        "Async TP)",
    )
    mesh_links: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="a node of these GPUs in a fully connected mesh rather than a switch (AMD's xGMI: 7 on "
        "an MI300X or MI325X platform): each GPU's links to its peers, intra_node_bandwidth_bytes_per_s "
        "their sum; a group of k of a node's GPUs uses k - 1 links, a send one. Absent: a switch (NVSwitch)",
    )
    # Sustained clocks (service.estimator.clocks). That a limit comes with its rating and stays at or
    # below it is the domain's rule (GPUSpec), reported by to_domain under the field's path.
    rated_power_w: float | None = Field(
        default=None,
        ge=MIN_POWER_W,
        le=MAX_POWER_W,
        description="the board power the peaks are quoted at (H100 SXM5: 700); needed with power_limit_w",
    )
    power_limit_w: float | None = Field(
        default=None,
        ge=MIN_POWER_W,
        le=MAX_POWER_W,
        description="the power limit the GPU runs at (nvidia-smi -pl), at most rated_power_w: the SM clock "
        "falls as the cube root of power_limit_w / rated_power_w and every compute peak with it "
        "(HBM and links keep theirs); the answer's assumptions state the peak used",
    )
    peak_clock_hz: float | None = Field(
        default=None,
        ge=MIN_CLOCK_HZ,
        le=MAX_CLOCK_HZ,
        description="the SM clock behind the peaks (H100 SXM5: 1.83e9); needed with sustained_clock_hz",
    )
    sustained_clock_hz: float | None = Field(
        default=None,
        ge=MIN_CLOCK_HZ,
        le=MAX_CLOCK_HZ,
        description="the SM clock the GPU holds under training load, at most peak_clock_hz: every compute "
        "peak scales by sustained_clock_hz / peak_clock_hz (wins over power_limit_w)",
    )

    @field_validator("chip")
    @classmethod
    def _known_chip(cls, chip: str | None) -> str | None:
        # the die in any case, or a catalog GPU whose parts share one ("H100": gh100, "MI300X": cdna3),
        # as the request names it as what the card is like; stored and echoed as the die
        known = known_chips()
        if chip is None or chip in known:
            return chip
        if chip.strip().lower() in known:
            return chip.strip().lower()
        product = re.sub(r"[^a-z0-9]", "", chip.lower())
        if product in DIE_OF_PRODUCT:
            return DIE_OF_PRODUCT[product]
        dies = _dies_of(chip)
        if len(dies) == 1:
            return dies.pop()
        like = f" (its parts are on {', '.join(sorted(dies))}: name the die)" if dies else ""
        raise ValueError(
            f"unknown chip {chip!r}{like}; known: {', '.join(known)}, a catalog GPU's name, or a product "
            f"on one of those dies ({', '.join(DIE_OF_PRODUCT)}); for a die the catalog lacks (B300, "
            "MI355X, RTX 5090), leave chip out: the most conservative fitted efficiency applies, with a "
            'warning (and state vendor "amd" for an AMD part: its launch files follow it)'
        )

    @field_validator("flash_attention")
    @classmethod
    def _kernels_the_die_has(cls, flash: bool | None, info: ValidationInfo) -> bool | None:
        # as the die's matrix units below: a die either has FlashAttention-2's kernels or not (they need
        # its tensor-core generation: flash-attn refuses sm_70 and sm_75), and a "gv100" part stated to
        # have them got attn_implementation="flash_attention_2" launch files that fail at load (hardware
        # review)
        chip = info.data.get("chip")
        if not flash or not chip:
            return flash
        parts = [spec for spec in catalog_gpus().values() if spec.chip == chip]
        if parts and not any(spec.flash_attention for spec in parts):
            names = ", ".join(spec.name for spec in parts)
            raise ValueError(
                f"the {chip} die has no FlashAttention-2 kernels (flash-attn needs NVIDIA Ampere or newer, "
                f"AMD CDNA 2/3; the catalog's parts of it, {names}, have none): leave flash_attention out, "
                "or name the die the part is built on"
            )
        return flash

    @field_validator("peak_flops_per_s")
    @classmethod
    def _peaks_the_die_has(cls, peaks: PeakFlopsIn, info: ValidationInfo) -> PeakFlopsIn:
        # a die either has a precision's matrix units or not (gpus.toml omits the peaks its parts lack:
        # V100 no bf16, A100 no fp8): a peak stated beyond them would be planned on (a "gv100" part
        # given a bf16 peak defaulted to bf16 training; a "ga100" one ran fp8; hardware review). A
        # field validator (chip, declared before, is validated), so the union's tag stays CustomGPU.
        chip = info.data.get("chip")
        if not chip:
            return peaks
        parts = [spec for spec in catalog_gpus().values() if spec.chip == chip]
        for precision in ("tf32", "bf16", "fp8"):
            if getattr(peaks, precision) is not None and all(
                getattr(spec.peak_flops_per_s, precision) is None for spec in parts
            ):
                names = ", ".join(spec.name for spec in parts)
                raise FieldError(
                    f"the {chip} die has no {precision} matrix units (the catalog's parts of it, {names}, "
                    f"have no {precision} peak): leave peak_flops_per_s.{precision} out, or name the die "
                    "the part is built on",
                    precision,
                )
        return peaks

    def to_domain(self, field: str = "gpu") -> GPUSpec:
        """The domain's GPU; its errors name the field as the request body does (``field``: where
        this GPU sits in it)."""
        try:
            return self._to_domain()
        except InvalidHardware as exc:
            located = field if exc.field is None else f"{field}.{exc.field}"
            raise exc.at(located) from exc

    def _to_domain(self) -> GPUSpec:
        pcie, intra, defaulted = self._links()
        return GPUSpec(
            name=self._own_name(),
            memory_bytes=self.memory_bytes,
            peak_flops_per_s=PeakFlops(**self.peak_flops_per_s.model_dump()),
            hbm_bandwidth_bytes_per_s=self.hbm_bandwidth_bytes_per_s,
            intra_node_bandwidth_bytes_per_s=intra,
            pcie_bandwidth_bytes_per_s=pcie,
            defaulted=defaulted,
            notes=self._peak_notes() + self._link_notes(pcie, intra) + self._vendor_notes(),
            vendor=self._vendor(),
            chip=self.chip or "",
            flash_attention=self._flash_attention(),
            peer_to_peer=self.peer_to_peer,
            mesh_links=self.mesh_links,
            source=CUSTOM_GPU_SOURCE,
            rated_power_w=self.rated_power_w,
            power_limit_w=self.power_limit_w,
            peak_clock_hz=self.peak_clock_hz,
            sustained_clock_hz=self.sustained_clock_hz,
        )

    def _peak_notes(self) -> tuple[str, ...]:
        """Peaks that look mistaken, said with every estimate (the part is timed on them as stated): one
        far above every catalog part of its die (of any die, without chip), as a datasheet's 2:4-sparse
        figure is twice the dense one the estimate needs (a GB200 spec copied from NVIDIA's datasheet
        was timed at 2.2x a B200's peak, silently: hardware review); a low precision's peak below a
        higher one's (bf16 under fp32, fp8 under bf16), as when two were swapped."""
        peaks = self.peak_flops_per_s
        parts, of = self._die_parts()
        notes = []
        for precision in ("tf32", "bf16", "fp16", "fp8"):
            stated = getattr(peaks, precision)
            known = [(getattr(spec.peak_flops_per_s, precision), spec.name) for spec in parts]
            above = _far_above(stated, [(peak, name) for peak, name in known if peak is not None])
            if stated is not None and above is not None:
                fastest, name = above
                notes.append(
                    f"peak_flops_per_s.{precision} {stated / 1e12:,.0f} TFLOP/s is {stated / fastest:.1f}x "
                    f"the fastest of {of} ({name}, {fastest / 1e12:,.0f}): timed as stated; datasheets print "
                    "2:4-sparse peaks, twice the dense ones an estimate needs: if it is one, halve it"
                )
        for low, high in (("bf16", "fp32"), ("fp8", "bf16")):
            low_peak, high_peak = getattr(peaks, low), getattr(peaks, high)
            if low_peak is not None and high_peak is not None and low_peak < high_peak:
                notes.append(
                    f"peak_flops_per_s.{low} ({low_peak / 1e12:,.4g} TFLOP/s) is below {high} "
                    f"({high_peak / 1e12:,.4g}): every part with {low} units runs it faster; timed as "
                    "stated, check the two are not swapped"
                )
        if (
            peaks.fp16 is not None
            and peaks.bf16 is not None
            and peaks.fp16 > SPARSE_LOOKING_RATIO * peaks.bf16
        ):
            # Ada and Ampere GeForce whitepapers print FP16 with FP16 accumulate at twice the FP32-
            # accumulate rate, bf16's, which mixed-precision training runs: a custom RTX 4090 stating
            # 330 TFLOP/s was timed (and defaulted to fp16) at twice its speed (a hardware review)
            notes.append(
                f"peak_flops_per_s.fp16 ({peaks.fp16 / 1e12:,.4g} TFLOP/s) is {peaks.fp16 / peaks.bf16:.1f}x "
                f"bf16 ({peaks.bf16 / 1e12:,.4g}): GeForce datasheets print FP16 with FP16 accumulate, while "
                "training accumulates in fp32 at the bf16 rate; timed as stated: if it is that figure, "
                "state the fp32-accumulate one"
            )
        return tuple(notes)

    def _die_parts(self) -> tuple[list[GPUSpec], str]:
        """The catalog's parts of this die (every part, without chip), and those words."""
        parts = [spec for spec in catalog_gpus().values() if not self.chip or spec.chip == self.chip]
        return parts, f"the catalog's {self.chip} parts" if self.chip else "every catalog part"

    def _link_notes(self, pcie: float, intra: float) -> tuple[str, ...]:
        """Links far above every catalog part of the die (of any part, without chip), as datasheets'
        bidirectional totals are twice the one-way figure this service reads (H100's "NVLink 900 GB/s"
        is 450 each way): a custom H800 stated at 900 GB/s had its TP time cut by 40%, silently (a
        hardware review)."""
        parts, of = self._die_parts()
        notes = []
        for field, stated in (
            ("intra_node_bandwidth_bytes_per_s", intra),
            ("pcie_bandwidth_bytes_per_s", pcie),
        ):
            if getattr(self, field) is None:
                continue  # a default is a catalog part's own
            above = _far_above(stated, [(float(getattr(spec, field)), spec.name) for spec in parts])
            if above is not None:
                fastest, name = above
                notes.append(
                    f"{field} {stated / 1e9:,.0f} GB/s is {stated / fastest:.1f}x the fastest of {of} "
                    f"({name}, {fastest / 1e9:,.0f}): timed as stated; datasheets print links as the sum "
                    "of both directions, twice the one-way figure this service reads: if it is one, halve it"
                )
        return tuple(notes)

    def _vendor_notes(self) -> tuple[str, ...]:
        """Where the vendor was assumed from no maker at all (no vendor, no chip of one maker), say so:
        it decides the launch files' device requests (Kubernetes' nvidia.com/gpu or amd.com/gpu) and the
        TF32 switches, and an MI355X described without it was rendered pods asking for NVIDIA GPUs,
        silently (defaults review)."""
        if self.vendor is not None or self._chip_maker() is not None:
            return ()
        return (
            f"vendor not stated for {self.name}, and no catalog chip names its maker: nvidia assumed (the "
            "launch files request nvidia.com/gpu devices); state vendor (or chip) for another maker's GPU",
        )

    def _chip_maker(self) -> str | None:
        """The maker of the catalog's parts of the stated chip, where they have one."""
        makers = {spec.vendor for spec in catalog_gpus().values() if spec.chip == self.chip}
        return makers.pop() if self.chip and len(makers) == 1 else None

    def _vendor(self) -> str:
        """Stated, else the maker of the catalog's parts of its die, else NVIDIA's (a custom MI325X
        was "custom", and its Kubernetes pods asked for nvidia.com/gpu: hardware review)."""
        if self.vendor is not None:
            return self.vendor
        return self._chip_maker() or "nvidia"

    def _own_name(self) -> str:
        """The name, marked custom where it is a catalog part's: a 24 GiB spec named h100-sxm-80gb was
        answered as "h100-sxm-80gb" with nothing saying it is not the catalog's part (its prices, its
        runs' calibration and the reader all took it for that part)."""
        if self.name.lower() in catalog_gpus():
            return f"{self.name} (custom)"
        return self.name

    def _flash_attention(self) -> bool:
        """Stated, else the catalog's parts of the die (a die either has the kernels or not: they
        need its tensor-core generation), else whether the part has a bf16 peak: FlashAttention-2
        needs NVIDIA Ampere or newer or AMD CDNA 2/3, all of which have bf16, and the parts without
        bf16 (Volta, Turing) have no such kernels. A pre-Ampere die defaulted to flash, which the
        catalog's V100 refuses."""
        if self.flash_attention is not None:
            return self.flash_attention
        if self.chip:
            return all(spec.flash_attention for spec in catalog_gpus().values() if spec.chip == self.chip)
        peaks = self.peak_flops_per_s
        if self._vendor() == "amd" and peaks.bf16 is not None and peaks.fp16 is not None:
            # ROCm's port runs on CDNA 2/3 (MI200, MI300: bf16 as fast as fp16); CDNA 1 (MI100: bf16 at
            # half fp16's rate) has bf16 units and no kernels (Dao-AILab/flash-attention README, "AMD ROCm
            # Support"; change review: a custom MI100 got flash_attention_2 launch files)
            return peaks.bf16 >= peaks.fp16
        return peaks.bf16 is not None

    def _links(self) -> tuple[float, float, tuple[tuple[str, str], ...]]:
        """(PCIe, intra-node, what was left out and the rule that chose it). Each default is the
        conservative one: the estimate is never faster than the part could be. The PCIe host link is
        the slowest of the catalog's parts of the die (the host interface is on the die); the link
        between GPUs is that host link, the path every GPU has to its peers (the catalog's PCIe cards
        are entered so), since NVLink is a property of the board, not of the die."""
        defaulted: list[tuple[str, str]] = []
        pcie = self.pcie_bandwidth_bytes_per_s
        if pcie is None:
            pcie, parts = slowest_host_link(self.chip)
            link = PCIE_X16.get(pcie, "PCIe")
            of = f"the catalog's {self.chip} parts" if self.chip else "any catalog part (chip not stated)"
            defaulted.append(
                ("pcie_bandwidth_bytes_per_s", f"the slowest host link of {of}: {link} ({', '.join(parts)})")
            )
        intra = self.intra_node_bandwidth_bytes_per_s
        if intra is None:
            intra = pcie
            defaulted.append(
                (
                    "intra_node_bandwidth_bytes_per_s",
                    "the GPU's PCIe host link, as a GPU without NVLink reaches its peers "
                    "(state it for NVLink)",
                )
            )
        return pcie, intra, tuple(defaulted)


def _far_above(stated: float | None, known: list[tuple[float, str]]) -> tuple[float, str] | None:
    """The fastest of ``known`` (figure, part) where ``stated`` is more than ``SPARSE_LOOKING_RATIO``
    times it, else None."""
    if stated is None or not known:
        return None
    fastest, name = max(known)
    return (fastest, name) if stated > SPARSE_LOOKING_RATIO * fastest else None


# A custom peak above this multiple of its die's fastest catalog part is said (CustomGPU._peak_notes):
# a 2:4-sparse figure is 2x the dense one, and a die's parts differ by clock and units by less (the
# catalog's gh100 parts: 756 to 989 TFLOP/s bf16; GB200's GPU, 2.5 PF dense, is 1.1x the B200's)
SPARSE_LOOKING_RATIO = 1.5


def resolve_gpu(gpu: str | CustomGPU, field: str = "gpu") -> GPUSpec:
    """A catalog name or a custom spec -> GPUSpec; an unknown name is a 422 naming the field."""
    if isinstance(gpu, CustomGPU):
        return gpu.to_domain(field)
    try:
        return catalog_gpu(gpu)
    except UnknownCatalogEntry as exc:
        raise Unprocessable(str(exc), errors=[unknown_entry_error(exc, field)]) from exc


def unknown_entry_error(exc: UnknownCatalogEntry, field: str) -> dict[str, Any]:
    """A problem's error entry for a catalog name that names no entry (or several: ``ambiguous``),
    with the entries it may mean (``candidates``) and every name there is (``known``)."""
    return {
        "field": field,
        "message": str(exc),
        "type": f"unknown_{exc.kind}",
        "candidates": list(exc.candidates),
        "ambiguous": exc.ambiguous,
        "known": list(exc.known),
    }


# Parts the catalog does not list, by their die (gpus.toml's header; the vendors' architecture
# whitepapers and datasheets): GH200's GPU, H800 and H20 are GH100; A800 and A30 GA100; L20 and RTX
# 6000 Ada AD102; RTX 4070 Ti AD104; A40, RTX A6000 and RTX 3080 / 3090 Ti GA102; Titan V GV100; B100
# and GB200's GPUs GB100 (the catalog's B200 die); MI210 CDNA 2 (an MI250's two GCDs are two GPUs, each
# the catalog's mi250x-gcd part); MI300A and MI325X (the MI300X's XCDs with HBM3E) CDNA 3. Keys: the
# name's letters and digits, lower case (a custom GPU with chip "GH200" was a 422 "unknown chip";
# "MI325X" still was: hardware review).
DIE_OF_PRODUCT = {
    "gh200": "gh100", "h800": "gh100", "h20": "gh100",
    "a800": "ga100", "a30": "ga100",
    "l20": "ad102", "rtx6000ada": "ad102", "rtx4070ti": "ad104",
    "a40": "ga102", "a6000": "ga102", "rtxa6000": "ga102", "rtx3080": "ga102", "rtx3090ti": "ga102",
    "titanv": "gv100",
    "b100": "gb100", "gb200": "gb100",
    "mi210": "cdna2", "mi300a": "cdna3", "mi325x": "cdna3",
}  # fmt: skip


def _dies_of(name: str) -> set[str]:
    """The dies of the catalog parts ``name`` names: one part's, or all those a family name names."""
    try:
        return {catalog_gpu(name).chip}
    except UnknownCatalogEntry as exc:
        return {catalog_gpu(slug).chip for slug in exc.candidates} if exc.ambiguous else set()


def reference_node(name: str) -> GPUEntry | None:
    """The catalog entry of GPU ``name`` where it ships in a node (``gpus_per_node``); None for a
    PCIe card or a name the catalog does not know (refused where the GPU is resolved)."""
    try:
        entry = catalog_gpu_entry(name)
    except UnknownCatalogEntry:
        return None
    return entry if entry.spec.node_gpus is not None else None


def gpu_slug(name: str) -> str:
    """The catalog slug ``name`` names (``catalog.gpus.gpu_entry``); UnknownCatalogEntry otherwise."""
    return catalog_gpu(name).name


class PeakFlopsOut(BaseModel):
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None


class GPUOut(BaseModel):
    name: str
    display_name: str
    vendor: str
    chip: str
    flash_attention: bool
    peer_to_peer: bool = Field(
        description="CUDA peer access between a node's GPUs (NVLink or PCIe P2P); without it (GeForce RTX "
        "3090 and 4090) no TP communication overlap (layout.tp_comm_overlap) runs"
    )
    mesh_links: int | None = Field(
        default=None,
        description="a node of GPUs in a fully connected mesh (MI300X's xGMI): each GPU's links to its "
        "peers, intra_node_bandwidth_bytes_per_s their sum; a group of k of them uses k - 1 links. Null: a "
        "switch (NVSwitch), every group at the whole bandwidth",
    )
    memory_bytes: int = Field(
        description="what a process sees, and the fit is checked against: the memory sold, less the 1/16 "
        "GDDR6's ECC (on by default on data-center cards) keeps its check bits in"
    )
    nominal_memory_bytes: int = Field(description="the memory the part is sold with (its name's GB: GiB)")
    peak_flops_per_s: PeakFlopsOut
    hbm_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    pcie_bandwidth_bytes_per_s: float
    # sustained clocks (gpus.toml): the rating the peaks are quoted at and the limit the part runs at
    rated_power_w: float | None = Field(
        default=None, description="board power the datasheet peaks are quoted at"
    )
    power_limit_w: float | None = Field(default=None, description="power limit the part runs at")
    peak_clock_hz: float | None = Field(default=None, description="the clock behind the datasheet peaks")
    sustained_clock_hz: float | None = Field(default=None, description="the clock the part holds under load")
    clock_fraction: float = Field(
        default=1.0,
        description="the share of peak_flops_per_s the estimate computes at: sustained / peak clock, else "
        "(power_limit_w / rated_power_w)^(1/3); 1 without either",
    )
    gpus_per_node: int | None = Field(
        default=None,
        description="GPUs of the node the part ships in (8 on an HGX baseboard): a cluster of it that leaves "
        "out gpus_per_node has it; null for a PCIe card, whose server holds what its buyer chose",
    )
    node_network_bytes_per_s: float | None = Field(
        default=None,
        description="each GPU's share of that node's network to other nodes, one direction (its reference "
        "system's NICs): a cluster of it across nodes that leaves out inter_node_bandwidth_bytes_per_s "
        "has it",
    )
    source: str
    notes: str = ""
