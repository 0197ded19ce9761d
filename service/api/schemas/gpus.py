"""Re-exports `service.contracts.gpus`, where the schemas live."""

from service.contracts.gpus import *  # noqa: F403
