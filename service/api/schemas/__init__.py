"""Wire schemas, one module per resource: pydantic models at the edge, with Field limits, turned
into domain types by their `to_domain()`. Import from the resource's module."""
