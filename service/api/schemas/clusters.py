"""Re-exports `service.contracts.clusters`, where the schemas live."""

from service.contracts.clusters import *  # noqa: F403
