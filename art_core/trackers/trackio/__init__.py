"""Trackio: a model's steps as a Trackio run, through the trackio SDK (extra `[trackio]`)."""

from art_core.trackers.trackio._observer import TrackioObserver, trackio_installed, trackio_tracker

__all__ = ["TrackioObserver", "trackio_installed", "trackio_tracker"]
