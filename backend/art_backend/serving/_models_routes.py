"""The routes of what is served: the models (GET /v1/models, also under a rollout-scoped base
URL) and the adapters a client loads (POST /v1/adapters, from inside the server's --path)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, FastAPI
from pydantic import BaseModel, ConfigDict

from art_backend._errors import InvalidNameError
from art_backend._limits import CheckedJsonRoute
from art_backend.engines._adapter_files import confined_adapter_folder
from art_backend.engines._chat_templates import has_chat_template
from art_backend.serving.chat._service import ChatService
from art_core.names import is_adapter_name


class LoadAdapterRequest(BaseModel):
    """POST /v1/adapters: serve a LoRA checkpoint under `name@step`."""

    model_config = ConfigDict(extra="forbid")

    name: str
    path: str


def attach_model_routes(app: FastAPI | APIRouter, service: ChatService, art_path: Path) -> None:
    """Add the model list and the adapter loading of `service` to `app`; adapters load from
    inside `art_path`."""
    router = APIRouter()

    async def list_models():
        # Without a chat template (a base model) only /v1/completions can serve it.
        chat = has_chat_template(service.engine.tokenizer)
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "art",
                    "chat_template": chat,
                }
                for name in service.served_models()
            ],
        }

    router.get("/v1/models")(list_models)
    router.get("/rollouts/{rollout_id}/v1/models")(list_models)

    async def load_adapter(body: LoadAdapterRequest):
        check_adapter_name(body.name)
        path = confined_adapter_folder(body.path, art_path)
        # Loading takes the engine lock between steps: keep the event loop free meanwhile.
        await asyncio.to_thread(service.engine.load_adapter, body.name, path)
        return {"id": body.name, "object": "model"}

    router.add_api_route(
        "/v1/adapters", load_adapter, methods=["POST"], route_class_override=CheckedJsonRoute
    )
    app.include_router(router)


def check_adapter_name(name: str) -> None:
    """A served adapter's name, `<name>@<step>`, else a 400 naming `name`."""
    if not is_adapter_name(name):
        raise InvalidNameError(
            f"Invalid adapter name {name!r}: use `<name>@<step>` with letters, digits, '.', '_' "
            "or '-' in the name.",
            param="name",
        )
