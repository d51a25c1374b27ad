"""One exception hierarchy for the client library: every error a user can cause is named here."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArtError",
    "BackendCrashedError",
    "BackendRequestError",
    "GeneratorContextError",
    "GeneratorError",
    "InvalidTrajectoryError",
    "JudgeContextError",
    "JudgeError",
    "JudgeResponseError",
    "JudgeUnavailableError",
    "LangfuseConfigError",
    "LangfuseNotInstalledError",
    "ModelConfigError",
    "ModelNotRegisteredError",
    "NotTrainableError",
    "PromotionGateError",
    "ScenarioGenerationError",
    "TooManyExceptionsError",
    "UnknownFieldError",
    "UnsupportedOptionError",
]


class ArtError(Exception):
    """Base class of every error art_core raises on purpose."""


class UnknownFieldError(ArtError, TypeError):
    """A keyword, field or attribute art_core does not have (usually a typo): never ignored.

    The message names the unknown name(s), the closest known one and all known ones; a
    `TypeError`, as Python raises for an unexpected keyword argument.
    """

    def __init__(self, message: str, *, unknown: list[str], known: list[str]) -> None:
        super().__init__(message)
        self.unknown = unknown
        self.known = known


class UnsupportedOptionError(ArtError, ValueError):
    """An option (usually one of ART's) this backend cannot honour with the value given, or
    options given in two forms at once; the message says what to use instead.

    A `ValueError`, as ART raises for the options its own LocalBackend refuses.
    """


class BackendRequestError(ArtError):
    """The backend refused a request (an HTTP 4xx/5xx); the message is the backend's."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class BackendCrashedError(ArtError):
    """The backend process exited or stopped answering; the message says where its log is."""


class ModelNotRegisteredError(ArtError):
    """The model was used before `await model.register(backend)`."""


class NotTrainableError(ArtError):
    """Training was asked of a `Model` (prompted, not trainable); use `TrainableModel`."""


class InvalidTrajectoryError(ArtError):
    """A trajectory cannot be sent for training (a NaN reward, a malformed message)."""


class TooManyExceptionsError(ArtError):
    """More rollouts raised than `max_exceptions` allows; the first traceback is attached."""

    def __init__(self, message: str, *, first_traceback: str = "") -> None:
        super().__init__(f"{message}\n\nFirst exception:\n{first_traceback}".rstrip())
        self.first_traceback = first_traceback


class ModelConfigError(ArtError):
    """A model named by a string (`"openai/gpt-4.1-mini"`) cannot be resolved: missing key or URL."""


class JudgeError(ArtError):
    """An LLM call for a judgement or for generated data failed; see the two subclasses."""


class JudgeUnavailableError(JudgeError):
    """The judge or generator did not answer: timeouts, 5xx or connection errors after retries."""


class JudgeContextError(JudgeError):
    """The judge answered that the prompt exceeds its context window (RULER then cuts harder)."""


class JudgeResponseError(JudgeError):
    """The judge's answer was unusable twice (malformed, short, duplicated or out-of-range).

    `problems` lists what was wrong with the last answer; `answer` is its text.
    """

    def __init__(self, message: str, *, problems: list[str], answer: str = "") -> None:
        super().__init__(message)
        self.problems = problems
        self.answer = answer


class ScenarioGenerationError(ArtError):
    """Scenario generation could not produce the requested number of valid, distinct scenarios."""


class GeneratorError(ScenarioGenerationError):
    """The scenario generator failed: unreachable after retries, or it refused the request."""


class GeneratorContextError(GeneratorError):
    """The generator's context window cannot hold the prompt plus the answer of one scenario."""


class LangfuseNotInstalledError(ArtError):
    """Langfuse export was asked for but the langfuse SDK is missing: install `[langfuse]`."""


class LangfuseConfigError(ArtError):
    """Langfuse export was asked for without its keys or host (LANGFUSE_* variables)."""


class PromotionGateError(ArtError):
    """A promotion gate cannot judge: bad settings, or its evaluation raised or returned no
    usable metric. A step it could not judge is trained and kept, but not promoted."""

    def __init__(self, message: str, *, result: Any = None) -> None:
        super().__init__(message)
        # the `TrainResult` of the trained step it could not judge, when there is one (typed
        # loosely: art_core.types imports this module)
        self.result = result
