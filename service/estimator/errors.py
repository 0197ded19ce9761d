"""Domain errors of the estimator; each message quotes the numbers that broke the rule."""

from __future__ import annotations


class EstimatorError(ValueError):
    """Base of every error the estimator raises on bad input.

    `rule` is a short stable slug naming the violated rule (e.g. ``world_size``) and `field`
    the input it concerns, so the web shell can turn it into a problem+json ``errors`` entry;
    `limit` the most the input may be, where the rule is an upper bound; `allowed` the values it
    may take, where the rule admits only some.
    """

    def __init__(
        self,
        message: str,
        *,
        rule: str = "invalid",
        field: str | None = None,
        limit: int | None = None,
        allowed: tuple[str | int, ...] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule
        self.field = field
        self.limit = limit
        self.allowed = allowed

    def at(self, field: str | None) -> EstimatorError:
        """The same error about ``field`` (as the request body names the input)."""
        return type(self)(self.message, rule=self.rule, field=field, limit=self.limit, allowed=self.allowed)


class InvalidModel(EstimatorError):
    """The model architecture is inconsistent (e.g. heads not dividing hidden size)."""


class InvalidHardware(EstimatorError):
    """The GPU or cluster description is inconsistent (e.g. zero memory)."""


class InvalidTraining(EstimatorError):
    """The training setup is inconsistent (e.g. LoRA without a rank)."""


class InvalidLayout(EstimatorError):
    """The parallel layout cannot run this model on this cluster."""


class DoesNotFit(EstimatorError):
    """Raised only by callers that demand a fitting layout; `estimate` itself reports fits=False."""
