"""Re-exports `service.contracts.estimates`, where the schemas live."""

from service.contracts.estimates import *  # noqa: F403
