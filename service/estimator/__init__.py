"""Pure estimator library: exact parameter counts, per-GPU memory and step time of a layout.

Imports nothing outside the standard library (tests/estimator/test_purity.py checks it).
Entry point: ``estimate(model, cluster, layout, training, tuning=...)``.
"""

from service.estimator.estimate import estimate

__all__ = ["estimate"]
