"""Every error the server raises on purpose, as one tree. Each maps to an OpenAI-shaped HTTP error
(`_app.py` answers `{"error": {"message", "type", "param", "code"}}` with the class's status).

Each class below is defined in this module; the status and error type it answers with stand
beside it (a subclass without them answers as its parent).

    BackendError                       500 server_error: everything raised on purpose
      InvalidRequestError                400 invalid_request_error: malformed, or out of range
        ContextLengthError                 prompt + max_tokens past the context window
        InvalidGrammarError                a schema or tool that compiles into no grammar
        InvalidNameError                   a model or adapter name that is not allowed
          UnsafePathError                    a store path that would leave --path (a symlink)
        StepsNotComparableError            two steps `art diff` cannot compare
        MalformedProtobufError             a protobuf body that is not the message the route takes
      AuthenticationError                401 authentication_error: missing or wrong API key
      CrossSiteRequestError              403 permission_error: a review form without its token
      NotFoundError                      404 not_found_error: what the request names is not here
        ModelNotServedError                no such served model (code model_not_found)
        ModelNotRegisteredError            training or logging for an unregistered model
        CompletionNotFoundError            no stored record of that completion
        ResponseNotFoundError              no stored response with that id
        StoreNotFoundError                 a project, model, step, group or trajectory
        RouteNotServedError                a route of an API served in part (the Tinker API's)
      ConflictError                      409 conflict_error: clashes with the server's state
        StoreFileDamagedError              a store file that cannot be read (torn, garbled, a folder)
      CheckpointLoadError                409 invalid_request_error: a checkpoint that won't load
        TrainerStateError                  its trainer state is unreadable or does not fit
      EngineStoppedError                 503 server_error: the engine stopped under the request
      TrainingRanksLostError             503 server_error: a training rank out of reach mid-step
      ModelLoadError                     at start: the base model cannot be found or loaded
        UnsupportedModelError              a family the torch engine cannot serve
      UnslothUnavailableError            at start: `--trainer unsloth` where it cannot run
      ReplayInputMissingError            `art replay`: a file it needs is gone
      BaseModelMismatchError             `art replay`: not the base model the step trained on
    RequestBodyTooLarge (HTTPException)  413: raised by the body-size middleware before routes

`tests/server/test_errors.py` checks that this tree is every exception class the server defines,
with these parents.

Validation errors (pydantic's) become 400s too: `reported_error` picks which of them a 400
reports and the field it names, for the OpenAI-shaped answers and the Anthropic-shaped alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.exceptions import HTTPException

TINKER_PREFIX = "/api/v1/"  # the Tinker API's routes: its SDK reads errors as `{"detail": ...}`


def error_body(
    path: str, message: str, *, error_type: str, param: str | None = None, code: Any = None
) -> dict[str, Any]:
    """The one error shape of `path`'s protocol: the Tinker SDK's `{"detail": message}` under
    /api/v1/, OpenAI's `{"error": {message, type, param, code}}` elsewhere (Anthropic's
    clients read the same object, wrapped as `{"type": "error", "error": ...}`)."""
    if path.startswith(TINKER_PREFIX):
        return {"detail": message}
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class BackendError(Exception):
    """Base class: every error the backend raises on purpose.

    A subclass states its HTTP answer in its header, `class X(Base, status_code=404,
    error_type="not_found_error")`; one that does not inherits its parent's.
    """

    status_code = 500
    error_type = "server_error"

    def __init_subclass__(
        cls, *, status_code: int | None = None, error_type: str | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status_code is not None:
            cls.status_code = status_code
        if error_type is not None:
            cls.error_type = error_type

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


# ----------------------------------------------------------------------------------------- 400


class InvalidRequestError(BackendError, status_code=400, error_type="invalid_request_error"):
    """The request is malformed or a parameter is out of range (HTTP 400)."""


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_tokens do not fit in the model's context window (HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = "max_tokens"):
        super().__init__(message, param=param, code="context_length_exceeded")


class InvalidGrammarError(InvalidRequestError):
    """A response_format schema or tool schema cannot be compiled into a grammar (HTTP 400)."""


class InvalidNameError(InvalidRequestError):
    """A model or adapter name is not allowed (path separators, traversal, odd characters)."""


class UnsafePathError(InvalidNameError):
    """A path that would leave the store's root (a symlink pointing outside it) (HTTP 400)."""


class StepsNotComparableError(InvalidRequestError):
    """Two steps that cannot be compared: the same step twice, or no example in common (400)."""


class MalformedProtobufError(InvalidRequestError):
    """A protobuf body that does not decode as the message its route takes (HTTP 400)."""


# ----------------------------------------------------------------------------------- 401, 403


class AuthenticationError(BackendError, status_code=401, error_type="authentication_error"):
    """Missing or wrong API key (HTTP 401)."""


class CrossSiteRequestError(BackendError, status_code=403, error_type="permission_error"):
    """A form without the page's CSRF token (HTTP 403): a page elsewhere cannot flag or approve."""


# ----------------------------------------------------------------------------------------- 404


class NotFoundError(BackendError, status_code=404, error_type="not_found_error"):
    """What the request names is not here (HTTP 404); each subclass says what."""


class ModelNotServedError(NotFoundError):
    """The requested model name is not served by this backend (HTTP 404)."""

    def __init__(self, message: str):
        super().__init__(message, param="model", code="model_not_found")


class ModelNotRegisteredError(NotFoundError):
    """Training or logging for a model this backend has not registered (HTTP 404)."""


class CompletionNotFoundError(NotFoundError):
    """No stored record of that completion: never served here, or evicted (HTTP 404)."""


class ResponseNotFoundError(NotFoundError):
    """No stored response has this id (HTTP 404)."""


class StoreNotFoundError(NotFoundError):
    """A project, model, step, group or trajectory that is not in the store (HTTP 404): what the
    review pages, `art diff` and `art replay` raise, naming what is there."""


class RouteNotServedError(NotFoundError):
    """A route of an API this server serves in part (the Tinker API's): the message names what
    is served instead (HTTP 404)."""


# ----------------------------------------------------------------------------------------- 409


class ConflictError(BackendError, status_code=409, error_type="conflict_error"):
    """The request clashes with the server's state (HTTP 409); the message says how to resolve it."""


class StoreFileDamagedError(ConflictError):
    """A file in the store that cannot be read: cut short, garbled, a folder where a file
    belongs (HTTP 409). What `art diff` and `art replay` raise; the message names the file and
    what to do."""


class CheckpointLoadError(BackendError, status_code=409, error_type="invalid_request_error"):
    """A checkpoint on disk that cannot be loaded onto this model (HTTP 409); says why."""


class TrainerStateError(CheckpointLoadError):
    """A checkpoint's trainer state that cannot be read safely or does not fit (HTTP 409)."""


# ----------------------------------------------------------------------------------------- 503


class EngineStoppedError(BackendError, status_code=503):
    """The engine was shut down while the request waited or ran (HTTP 503)."""


class TrainingRanksLostError(BackendError, status_code=503):
    """A collective of a step on several processes timed out or lost its connection: nothing
    was trained, and the step can be sent again once the ranks' hosts reach each other."""


# ----------------------------------------------------- raised at start or by `art replay`


class ModelLoadError(BackendError):
    """The base model could not be found or loaded; the message names the alternatives."""


class UnsupportedModelError(ModelLoadError):
    """The torch engine cannot serve this model's family (named in the message)."""


class UnslothUnavailableError(BackendError):
    """`--trainer unsloth` was asked for where Unsloth cannot run; the message says what to do."""


class ReplayInputMissingError(BackendError):
    """A file `art replay` needs is gone (a deleted checkpoint, a removed input file)."""


class BaseModelMismatchError(BackendError):
    """The base model's files `art replay` was given are not those the step trained on."""


# ---------------------------------------------------------------------------- before routes


class RequestBodyTooLarge(HTTPException):
    """The request body passed `--max-body-mb` (HTTP 413; the app's handler gives it OpenAI's shape)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


# --------------------------------------------------------------------- validation errors' field


def reported_error(errors: Sequence[Any]) -> tuple[Any, str | None]:
    """The one of pydantic's `errors` a 400 reports, and the field it names (`messages[0].role`).

    The first field that failed; among its errors, the one deepest inside it: a value that fits
    no branch of a union fails once per branch, and the branch it was meant for (a list of
    blocks, not a string) is the one that reached furthest into it (`system[0].text`).
    """
    top = _top(field_path(tuple(errors[0].get("loc", ()))))
    same_field = [e for e in errors if _top(field_path(tuple(e.get("loc", ())))) == top]
    chosen = max(same_field, key=lambda e: len(_real_parts(tuple(e.get("loc", ())))))
    return chosen, field_path(tuple(chosen.get("loc", ())))


def _top(path: str | None) -> str | None:
    return path.split(".")[0].split("[")[0] if path else None


REQUEST_PARTS = ("body", "query", "path", "header", "cookie")  # FastAPI's first location part


def _real_parts(location: tuple[Any, ...]) -> list[Any]:
    """The location without where FastAPI read it ("body", "query", "path", ...) and pydantic's
    union branch names (`str`, `list[...]`, `function-after[...]`)."""
    if location and location[0] in REQUEST_PARTS:
        location = location[1:]
    return [
        part
        for part in location
        if not (isinstance(part, str) and ("[" in part or part in {"str", "int", "body"}))
    ]


def field_path(location: tuple[Any, ...]) -> str | None:
    """`messages.0.content.1.type` as `messages[0].content[1].type` (see `_real_parts`)."""
    text = ""
    for part in _real_parts(location):
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or None
