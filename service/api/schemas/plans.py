"""Re-exports `service.contracts.plans`, where the schemas live."""

from service.contracts.plans import *  # noqa: F403
