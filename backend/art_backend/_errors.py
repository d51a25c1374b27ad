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


class ModelNotServedError(BackendError):
    """The requested model name is not served by this backend (HTTP 404)."""

    status_code = 404
    error_type = "not_found_error"

    def __init__(self, message: str):
        super().__init__(message, param="model", code="model_not_found")


class CompletionNotFoundError(BackendError):
    """No stored record of that completion: never served here, or evicted (HTTP 404)."""

    status_code = 404
    error_type = "not_found_error"


class AuthenticationError(BackendError):
    """Missing or wrong API key (HTTP 401)."""

    status_code = 401
    error_type = "authentication_error"


class ModelLoadError(BackendError):
    """The base model could not be found or loaded; the message names the alternatives."""


class InvalidNameError(InvalidRequestError):
    """A model or adapter name is not allowed (path separators, traversal, odd characters)."""


class EngineStoppedError(BackendError):
    """The engine was shut down while the request waited or ran (HTTP 503)."""

    status_code = 503
    error_type = "server_error"
