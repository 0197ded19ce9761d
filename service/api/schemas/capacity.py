"""Re-exports `service.contracts.capacity`, where the schemas live."""

from service.contracts.capacity import *  # noqa: F403
