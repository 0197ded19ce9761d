"""Re-exports `service.contracts.models`, where the schemas live."""

from service.contracts.models import *  # noqa: F403
