"""Warnings about how far an estimate can be trusted for this input: a GPU whose die is not stated
(timed at the most conservative fitted efficiency)."""

from __future__ import annotations

from service.estimator.job import Job
from service.estimator.tuning import Tuning, conservative_peak_fraction

# Parts users describe as a custom GPU and the catalog die each is built on (the vendors' architecture
# whitepapers and datasheets: H800, H20 and GH200's GPU are GH100 dies; A800 and A30 GA100; L20, L40 and
# RTX 6000 Ada AD102; GB200's GPUs GB100), quoted by the warning.
CHIP_EXAMPLES = "gh100 for H800, H20 or GH200, ga100 for A800 or A30, ad102 for L20 or L40, gb100 for GB200"


def fitted_fractions(tuning: Tuning) -> str:
    """The GEMM peak fractions fitted per die, as 'chip fraction' pairs."""
    return ", ".join(f"{chip} {fraction:g}" for chip, fraction in sorted(tuning.peak_fraction_by_chip))


def chip_warnings(job: Job) -> tuple[str, ...]:
    """A GPU without ``chip`` (a custom part) is timed at the most conservative fitted efficiency
    (``tuning.peak_fraction``, ``tuning.attention_kernel_rate``): say so, and what to set."""
    tuning = job.tuning
    if job.cluster.gpu.chip or not tuning.peak_fraction_by_chip:
        return ()
    fraction = conservative_peak_fraction(tuning)
    return (
        "custom GPU without chip: the most conservative fitted efficiency (GEMMs at "
        f"{fraction:g} of the dense peak, the lowest of {fitted_fractions(tuning)}; "
        "attention's core at its kernel's slowest published rate, at most the GEMM rate) is used; set chip "
        f"to the GPU's die for the efficiency fitted on it ({CHIP_EXAMPLES})",
    )
