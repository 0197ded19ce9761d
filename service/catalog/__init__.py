"""Data catalogs (GPUs, model presets, efficiency curves): TOML files with a source per entry,
parsed and validated once into estimator types."""
