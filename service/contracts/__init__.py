"""The service's contract: its wire schemas (one module per resource: pydantic models at the edge, with
Field limits, turned into domain types by their `to_domain()`) and the typed, versioned results it
stores (`results`). Shared by `service.planning` and `service.api`; imports neither. Import from the
resource's module."""
