"""One exception hierarchy for the backend. Each maps to an OpenAI-shaped HTTP error."""

from __future__ import annotations


class BackendError(Exception):
    """Base class: every error the backend raises on purpose."""

    status_code = 500
    error_type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequestError(BackendError):
    """The request is malformed or a parameter is out of range (HTTP 400)."""

    status_code = 400
    error_type = "invalid_request_error"


class ConflictError(BackendError):
    """The request clashes with the server's state (HTTP 409); the message says how to resolve it."""

    status_code = 409
    error_type = "conflict_error"


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_tokens do not fit in the model's context window (HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = "max_tokens"):
        super().__init__(message, param=param, code="context_length_exceeded")


class InvalidGrammarError(InvalidRequestError):
    """A response_format schema or tool schema cannot be compiled into a grammar (HTTP 400)."""


class NotFoundError(BackendError):
    """What the request names is not here (HTTP 404); each subclass says what."""

    status_code = 404
    error_type = "not_found_error"


class ModelNotServedError(NotFoundError):
    """The requested model name is not served by this backend (HTTP 404)."""

    def __init__(self, message: str):
        super().__init__(message, param="model", code="model_not_found")


class CompletionNotFoundError(NotFoundError):
    """No stored record of that completion: never served here, or evicted (HTTP 404)."""


class AuthenticationError(BackendError):
    """Missing or wrong API key (HTTP 401)."""

    status_code = 401
    error_type = "authentication_error"


class ModelLoadError(BackendError):
    """The base model could not be found or loaded; the message names the alternatives."""


class UnsupportedModelError(ModelLoadError):
    """The torch engine cannot serve this model's family (named in the message)."""


class InvalidNameError(InvalidRequestError):
    """A model or adapter name is not allowed (path separators, traversal, odd characters)."""


class EngineStoppedError(BackendError):
    """The engine was shut down while the request waited or ran (HTTP 503)."""

    status_code = 503
    error_type = "server_error"


class ModelNotRegisteredError(NotFoundError):
    """Training or logging for a model this backend has not registered (HTTP 404)."""


class UnslothUnavailableError(BackendError):
    """`--trainer unsloth` was asked for where Unsloth cannot run; the message says what to do."""


class CheckpointLoadError(BackendError):
    """A checkpoint on disk that cannot be loaded onto this model (HTTP 409); says why."""

    status_code = 409
    error_type = "invalid_request_error"


class TrainerStateError(CheckpointLoadError):
    """A checkpoint's trainer state that cannot be read safely or does not fit (HTTP 409)."""


class StoreNotFoundError(NotFoundError):
    """A project, model, step, group or trajectory that is not in the store (HTTP 404): what the
    review pages, `art diff` and `art replay` raise, naming what is there."""


class StepsNotComparableError(InvalidRequestError):
    """Two steps that cannot be compared: the same step twice, or no example in common (400)."""


class ReplayInputMissingError(BackendError):
    """A file `art replay` needs is gone (a deleted checkpoint, a removed input file)."""


class BaseModelMismatchError(BackendError):
    """The base model's files `art replay` was given are not those the step trained on."""


class CrossSiteRequestError(BackendError):
    """A form without the page's CSRF token (HTTP 403): a page elsewhere cannot flag or approve."""

    status_code = 403
    error_type = "permission_error"


class ResponseNotFoundError(NotFoundError):
    """No stored response has this id (HTTP 404)."""
