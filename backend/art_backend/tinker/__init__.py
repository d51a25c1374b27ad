"""The Tinker API (`tinker` SDK 0.38) on art-server: its routes, wire and semantics over our trainer
and engine. A wing of its own, above `training` and `engines`: it both trains and samples."""

from art_backend.tinker._routes import attach_tinker_routes

__all__ = ["attach_tinker_routes"]
