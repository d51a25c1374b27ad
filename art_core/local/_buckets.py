"""ART's `_experimental_push_to_s3` / `_experimental_pull_from_s3`: a model's folder copied to
and from a bucket, any fsspec URL (`s3://`, `gs://`, `file://`, or a local folder).

The bucket's layout is ART's: `<bucket>/<prefix>/<project>/models/<name>/` holds what the
backend's `<path>/<project>/models/<name>/` holds (checkpoints, history, trajectories). Needs
fsspec and the filesystem's package (`s3fs` for s3://, `gcsfs` for gs://); without them the
error says where the files are and how to copy them by hand.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path
from typing import Any, Literal

from art_core.errors import UnsupportedOptionError

# ART's `exclude` choices: the model folder's parts a pull may skip.
EXCLUDABLE = ("checkpoints", "logs", "trajectories")


def bucket_url(
    folder: Path, project: str, name: str, s3_bucket: str | None, prefix: str | None
) -> str:
    """The model's folder in the bucket (ART's default bucket: $BACKUP_BUCKET)."""
    bucket = s3_bucket or os.environ.get("BACKUP_BUCKET")
    if not bucket:
        raise UnsupportedOptionError(
            "no bucket: pass s3_bucket= (an S3 bucket's name, or any fsspec URL: "
            f"gs://..., file:///...) or set BACKUP_BUCKET. The model's files are in {folder}"
        )
    # A bucket's name has no slash: a value with one is already a URL or a folder.
    base = bucket.rstrip("/") if "/" in bucket else f"s3://{bucket}"
    parts = [base, *([prefix.strip("/")] if prefix else []), project, "models", name]
    return "/".join(parts)


def _filesystem(url: str, folder: Path, action: str) -> tuple[Any, str]:
    """fsspec's filesystem and path for `url`; a missing package is named."""
    try:
        import fsspec  # type: ignore[import-untyped, unused-ignore]  # optional: only here

        return fsspec.core.url_to_fs(url)
    except ImportError as error:
        raise UnsupportedOptionError(
            f"{action} needs fsspec and the filesystem's package for {url} ({error}): "
            "pip install fsspec s3fs (gcsfs for gs://). Or copy the model's folder yourself: "
            f"it is {folder} (e.g. `aws s3 sync {folder} {url}`)."
        ) from error


def _wanted(relative: str, exclude: list[str], only_step: int | None) -> bool:
    top, _, rest = relative.partition("/")
    if top in exclude:
        return False
    if only_step is not None and top == "checkpoints":
        return rest.split("/", 1)[0] == f"{only_step:04d}"
    return True


def _files(fs: Any, root: str) -> dict[str, str]:
    """relative path -> full path of every file under `root` (none when it does not exist)."""
    if not fs.exists(root):
        return {}
    root = root.rstrip("/")
    return {path[len(root) + 1 :]: path for path in fs.find(root)}


def _latest_step(files: dict[str, str]) -> int | None:
    steps = [
        int(part)
        for relative in files
        if relative.startswith("checkpoints/") and (part := relative.split("/")[1]).isdigit()
    ]
    return max(steps, default=None)


def sync(
    source: str,
    target: str,
    *,
    folder: Path,
    action: str,
    delete: bool = False,
    exclude: list[str] | None = None,
    only_step: int | Literal["latest"] | None = None,
) -> int:
    """Copy every file under `source` to `target` (URLs or paths); `delete`: remove target files
    the source lacks. Returns how many files were copied."""
    exclude = list(exclude or [])
    unknown = sorted(set(exclude) - set(EXCLUDABLE))
    if unknown:
        raise UnsupportedOptionError(f"{action}: exclude={unknown}: the choices are {EXCLUDABLE}")
    source_fs, source_root = _filesystem(source, folder, action)
    target_fs, target_root = _filesystem(target, folder, action)
    files = _files(source_fs, source_root)
    step = _latest_step(files) if only_step == "latest" else only_step
    files = {rel: path for rel, path in files.items() if _wanted(rel, exclude, step)}
    for relative, path in files.items():
        destination = posixpath.join(target_root.rstrip("/"), relative)
        target_fs.makedirs(posixpath.dirname(destination), exist_ok=True)
        with source_fs.open(path, "rb") as reader, target_fs.open(destination, "wb") as writer:
            shutil.copyfileobj(reader, writer)
    if delete:
        for relative, path in _files(target_fs, target_root).items():
            if relative not in files and _wanted(relative, exclude, step):
                target_fs.rm(path)
    return len(files)
