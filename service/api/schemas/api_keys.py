"""Re-exports `service.contracts.api_keys`, where the schemas live."""

from service.contracts.api_keys import *  # noqa: F403
