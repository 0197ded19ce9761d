"""Re-exports `service.contracts.training`, where the schemas live."""

from service.contracts.training import *  # noqa: F403
