"""A griffe extension for the API pages (mkdocs.yml loads it; it is not part of the site).

`from pkg.ruler import ruler` in a package's `__init__` binds `pkg.ruler` to the function at run
time, but griffe's static analysis keeps the submodule of the same name (mkdocstrings/griffe#124),
so `::: art_core` would render the module `art_core.rewards.ruler` where `art_core.ruler` is the
function. An exported alias whose target is a module holding a member of the alias's own name is
pointed at that member, as Python does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe


class ReexportsShadowedBySubmodules(griffe.Extension):
    """Point `pkg.name` at `pkg.sub.name.name` where an import shadowed the submodule `name`."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for module in _modules(pkg):
            for name, member in list(module.members.items()):
                if not isinstance(member, griffe.Alias) or not member.is_exported:
                    continue
                try:
                    target = member.final_target
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    continue
                if target.is_module and name in target.members:
                    member.target = target.members[name]


def _modules(module: griffe.Module) -> Iterator[griffe.Module]:
    yield module
    for member in module.members.values():
        if not member.is_alias and isinstance(member, griffe.Module):
            yield from _modules(member)
