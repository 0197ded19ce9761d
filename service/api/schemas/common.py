"""Re-exports `service.contracts.common`, where the schemas live."""

from service.contracts.common import *  # noqa: F403
