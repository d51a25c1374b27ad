"""One exception hierarchy for the client library: every error a user can cause is named here.

Each class below is defined in this module; the rooms that raise them import them from here
(`art_core.rewards.PreflightError`, `art_core.capture.NoTrajectoryError` and
`art_core.utils.sft.InvalidSFTFileError` stay importable where ART users find them). A second
base in parentheses is a builtin a caller may catch instead, as Python raises it.

    ArtError                               every error art_core raises on purpose
      UnknownFieldError (TypeError)          a keyword, field or attribute art_core lacks
      UnsupportedOptionError (ValueError)    an option this backend cannot honour as given
      BackendRequestError                    the backend refused a request (HTTP 4xx/5xx)
      BackendCrashedError                    the backend process exited or stopped answering
      ModelNotRegisteredError                a model used before `model.register(backend)`
      NotTrainableError                      training asked of a prompted `Model`
      InvalidTrajectoryError                 a trajectory that cannot be sent for training
      NoTrajectoryError (RuntimeError)       `current_trajectory(require=True)` out of scope
      TooManyExceptionsError                 more rollouts raised than `max_exceptions`
      ModelConfigError                       a model named by a string cannot be resolved
      JudgeError                             an LLM call for a judgement or data failed
        JudgeUnavailableError                  the judge did not answer, after retries
        JudgeContextError                      the prompt exceeds the judge's context window
        JudgeResponseError                     the judge's answer was unusable twice
      ScenarioGenerationError                too few valid, distinct scenarios
        GeneratorError                         the generator failed or refused
          GeneratorContextError                  one scenario does not fit its context
      PreflightError (ValueError)            preflight cannot run as asked
      InvalidSFTFileError (ValueError)       an SFT file that is not JSONL conversations
      LangfuseNotInstalledError              Langfuse export asked for without the SDK
      LangfuseConfigError                    Langfuse export asked for without keys or host
      ReviewReadError                        a Langfuse review read-back poll failed (retried)
      PromotionGateError                     a promotion gate cannot judge a step
      TrainingCommandError (ValueError)      a training client's command out of order or
                                             reusing an id with another body
      TrainingInputMismatchError (ValueError)  a stored training input whose bytes changed
    IgnoredSettingWarning (UserWarning)    a warning: an ART setting that only places or sizes
                                           the work, ignored here (`art.dev`)
    BackendWarning (UserWarning)           a warning: one the backend's server logged while
                                           `LocalBackend` started it

`tests/core/test_errors.py` holds this drawing to the classes: a new error goes in the tree.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArtError",
    "BackendCrashedError",
    "BackendRequestError",
    "BackendWarning",
    "GeneratorContextError",
    "GeneratorError",
    "IgnoredSettingWarning",
    "InvalidSFTFileError",
    "InvalidTrajectoryError",
    "JudgeContextError",
    "JudgeError",
    "JudgeResponseError",
    "JudgeUnavailableError",
    "LangfuseConfigError",
    "LangfuseNotInstalledError",
    "ModelConfigError",
    "ModelNotRegisteredError",
    "NoTrajectoryError",
    "NotTrainableError",
    "PreflightError",
    "PromotionGateError",
    "ReviewReadError",
    "ScenarioGenerationError",
    "TooManyExceptionsError",
    "TrainingCommandError",
    "TrainingInputMismatchError",
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


class NoTrajectoryError(ArtError, RuntimeError):
    """`current_trajectory(require=True)` outside every `art.trajectory()` scope."""


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


class PreflightError(ArtError, ValueError):
    """Preflight cannot run as asked (no scenarios, a group smaller than 2, ...); says why."""


class TrainingCommandError(ArtError, ValueError):
    """A training client's command that cannot be admitted: another run's, out of its place in
    the run's order, or a request id used before with another body. Says which and why."""


class TrainingInputMismatchError(ArtError, ValueError):
    """A stored training input whose bytes are not the ones its reference names (size or
    SHA-256): it was changed or replaced after it was stored. Nothing is trained from it."""


class InvalidSFTFileError(ArtError, ValueError):
    """An SFT file that is not JSONL conversations; the message names the file and line.

    A `ValueError`, as ART raises for a file that is not `.jsonl`.
    """

    def __init__(self, message: str, *, path: str, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class LangfuseNotInstalledError(ArtError):
    """Langfuse export was asked for but the langfuse SDK is missing: install `[langfuse]`."""


class LangfuseConfigError(ArtError):
    """Langfuse export was asked for without its keys or host (LANGFUSE_* variables)."""


class ReviewReadError(ArtError):
    """A read or write of the Langfuse review read-back failed; the poll is counted and retried,
    so it never reaches the caller (`art_core.trackers.langfuse._review`)."""


class PromotionGateError(ArtError):
    """A promotion gate cannot judge: bad settings, or its evaluation raised or returned no
    usable metric. A step it could not judge is trained and kept, but not promoted."""

    def __init__(self, message: str, *, result: Any = None) -> None:
        super().__init__(message)
        # the `TrainResult` of the trained step it could not judge, when there is one (typed
        # loosely: art_core.types imports this module)
        self.result = result


class IgnoredSettingWarning(UserWarning):
    """An ART setting ignored here: one that only places or sizes the work (a GPU id, a memory
    fraction), where art-server places and sizes the engine itself (`art_core.dev`), or a
    LiteLLM parameter RULER's judge call cannot honour (`extra_litellm_params`)."""


class BackendWarning(UserWarning):
    """A warning `art-server` logged while `LocalBackend` started it (a base model without a chat
    template, say): its log goes to `backend.log`, so LocalBackend warns with it here too."""
