"""The web shell: one thin router per resource (assembled in `service.api.main`), wire schemas
(`service.contracts`, re-exported by `service.api.schemas`), dependencies and problem+json rendering."""
