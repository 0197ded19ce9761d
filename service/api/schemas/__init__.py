"""The wire schemas live in `service.contracts` (shared with `service.planning`, which imports
nothing from `service.api`); the modules here re-export them for code written against the old
place. New code imports `service.contracts.<resource>`."""
