"""Pure estimator library: exact parameter counts, per-GPU memory and step time of a layout.

Imports nothing outside the standard library (tests/estimator/test_purity.py checks it).
Entry point: ``estimate(model, cluster, layout, training, efficiency=...)``.
"""

from service.estimator.estimate import estimate

__all__ = ["estimate"]

# Bumped whenever a formula changes what an estimate says; stored with every plan.
ESTIMATOR_VERSION = "0.3.0"  # 0.3.0: eager attention core slowed at an unaligned head_dim
