"""Invariants over the input space (issue 24): properties every answer must have, checked with
hypothesis on the estimator and on a small grid of API requests; ``bench/invariant_sweep.py`` runs
the same checks over every preset x every catalog GPU x full/LoRA/QLoRA."""
