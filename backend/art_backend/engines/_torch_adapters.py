"""The torch engine's adapters: LoRA adapters served by name and a trainer's, all in one PEFT
model, and the switch that bypasses them for a base-model forward.

`AdapterSlots` is a part of `TorchEngine` (its base class): the engine thread decodes while these
methods change the adapter set under the engine's lock.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from art_backend.engines._adapter_files import check_adapter_folder
from art_backend.engines._adapter_reuse import RETIRED, load_into
from art_backend.engines._batch_invariant import floor_linear_rows
from art_backend.engines._lora_forward import lean_lora_forward

# PEFT's PeftModel() reads `model.is_gradient_checkpointing`, which transformers 5 deprecated for
# `is_activation_checkpointing` with a FutureWarning: shown once per process in backend.log and
# once per wrap in a test summary, about code that is not ours. Ignored by its text (the
# suite's pytest configuration repeats the filter: pytest resets filters after each test).
warnings.filterwarnings(
    "ignore",
    message="`is_gradient_checkpointing` is deprecated",
    category=FutureWarning,
    module="transformers",
)


class AdapterSlots:
    """Served adapters (`served name -> PEFT adapter name`) and trainers' adapters."""

    model: Any
    adapters: dict[str, str]
    adaptable_modules: list[str]
    _linear_shapes: Any
    _adapter_counter: itertools.count[int]
    _lora_layers_key: tuple[str, ...] | None
    _lora_layers_cache: list[Any]
    _retired: list[str]  # unloaded adapters whose layers the next load may reuse
    _lock: threading.Lock

    def _init_adapter_slots(self) -> None:
        self._lora_layers_key, self._lora_layers_cache, self._retired = None, [], []

    def load_adapter(self, served_name: str, path: Path) -> None:
        """Load a PEFT LoRA adapter from `path`, served as `served_name` (e.g. `agent@3`): into
        a retired adapter's layers where they fit it (`_adapter_reuse`), else by PEFT."""
        # A folder PEFT would fail on is a 400 before PEFT wraps any layer of the model.
        check_adapter_folder(path, self.adaptable_modules, self._linear_shapes)
        with self._lock:
            adapter_name = next((n for n in self._retired if load_into(self.model, n, path)), None)
            if adapter_name is not None:
                self._retired.remove(adapter_name)  # its layers hold the new weights now
            else:
                adapter_name = self._peft_load(path)
            previous = self.adapters.get(served_name)
            self.adapters[served_name] = adapter_name
            if previous is not None:
                self._retire(previous)

    def _peft_load(self, path: Path) -> str:
        """PEFT's load of the adapter in `path` as a new adapter of the model; its name."""
        from peft import PeftModel

        adapter_name = f"adapter_{next(self._adapter_counter)}"
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(str(path), adapter_name=adapter_name, is_trainable=False)
        else:
            self.model = PeftModel.from_pretrained(
                self.model, str(path), adapter_name=adapter_name, is_trainable=False
            )
        self.model.eval()
        floor_linear_rows(self.model)  # the adapter's new LoRA layers too
        lean_lora_forward(self.model)
        return adapter_name

    def add_trainable_adapter(self, adapter_name: str, peft_config: Any) -> None:
        """Add a fresh LoRA adapter for a trainer; it is never served under its own name."""
        from peft import PeftModel, get_peft_model

        with self._lock:
            if isinstance(self.model, PeftModel):
                self.model.add_adapter(adapter_name, peft_config)
            else:
                self.model = get_peft_model(self.model, peft_config, adapter_name=adapter_name)
            self.model.eval()
            floor_linear_rows(self.model)  # the adapter's new LoRA layers too
            lean_lora_forward(self.model)

    def remove_trainable_adapter(self, adapter_name: str) -> None:
        """Remove a trainer's adapter (its trainer closed, or failed to start)."""
        with self._lock:
            self._delete_adapter(adapter_name)
            self._drop_retired_if_alone()

    def unload_adapter(self, served_name: str) -> None:
        """Stop serving an adapter; its layers are kept for the next load (`RETIRED` at most)."""
        with self._lock:
            self._retire(self.adapters.pop(served_name))

    def _retire(self, adapter_name: str) -> None:
        """Keep a served adapter no name reaches any more for the next load; delete the oldest
        past `RETIRED`, and every retired one once nothing else is loaded (the plain model
        again: a base model's forward pays nothing for PEFT's wrapper). Lock held."""
        self._retired.append(adapter_name)
        while len(self._retired) > RETIRED:
            self._delete_adapter(self._retired.pop(0))
        self._drop_retired_if_alone()

    def _drop_retired_if_alone(self) -> None:
        """Delete the retired adapters if no other adapter is loaded (lock held)."""
        if self._retired and set(self.model.peft_config) <= set(self._retired):
            while self._retired:
                self._delete_adapter(self._retired.pop())

    def _delete_adapter(self, adapter_name: str) -> None:
        """Delete one PEFT adapter; the plain model again once none is left (lock held).

        PEFT keeps naming the last adapter as active after it is deleted, and its forward then
        fails on every request (`KeyError`) until a restart; without adapters the wrapper has
        nothing to add, so the engine unwraps the model instead.
        """
        self.model.delete_adapter(adapter_name)
        if not self.model.peft_config:
            self.model = self.model.unload()
            self.model.eval()

    @contextlib.contextmanager
    def routed_through(self, served_name: str | None) -> Iterator[None]:
        """One forward of the held model (`exclusive`) through a served adapter, or through the
        base model (None): a scorer outside the decode loop, routed as the loop routes a row."""
        if not hasattr(self.model, "peft_config"):
            yield  # no adapter loaded: the model is the base model
        elif served_name is None:
            with self._adapters_off():
                yield
        else:
            self.model.set_adapter(self.adapters[served_name])
            yield

    @contextlib.contextmanager
    def _adapters_off(self) -> Iterator[None]:
        """The base model for one forward: every LoRA layer bypassed, nothing else touched.

        PEFT's `disable_adapter()` first inspects the status of every module (a quarter of a
        SmolLM2 decode step) and resets requires_grad; a judge or a generator served from the
        base model pays that on every token. Flipping the layers' own switch costs microseconds.
        """
        layers = self._lora_layers()
        previous = [layer._disable_adapters for layer in layers]
        for layer in layers:
            layer._disable_adapters = True
        try:
            yield
        finally:
            for layer, value in zip(layers, previous, strict=True):
                layer._disable_adapters = value

    def _lora_layers(self) -> list[Any]:
        """The model's adapter layers, found again only when the set of adapters changes."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        key = tuple(self.model.peft_config)
        if self._lora_layers_key != key:
            self._lora_layers_cache = [
                m for m in self.model.modules() if isinstance(m, BaseTunerLayer)
            ]
            self._lora_layers_key = key
        return self._lora_layers_cache
