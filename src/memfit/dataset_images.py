"""The images a dataset row names, and the tokens a vision-language model makes of them (the dataset check).

Sizes come from the files' headers: Pillow's Image.open reads the header and decodes no pixels until asked. The
tokens per image are the model's processor rule (vision.image_token_rule). Paths are relative to the dataset file.
"""

from __future__ import annotations

from pathlib import Path

from .errors import MissingExtraError, SourceError, shorten

# ---- rows ------------------------------------------------------------------------------------------------------
# Where rows name their images: LLaMA-Factory and ms-swift "images" (a list of paths, or {"path": ...} / {"bytes":
# ...} as the datasets Image feature stores them), LLaVA's "image", and chat content parts {"type": "image",
# "image" | "path" | "url": ...} (TRL, axolotl) or OpenAI's {"type": "image_url", "image_url": {"url": ...}}.
_PART_KEYS = ("image", "path", "url")


def image_refs(record: dict) -> list:
    """The images one dataset row names, in order (paths, data: URLs, or {"bytes"/"path"} dicts)."""
    refs: list = []
    for key in ("images", "image"):
        value = record.get(key)
        if value is None:
            continue
        refs += value if isinstance(value, list) else [value]
    for key in ("messages", "conversations"):
        messages = record.get(key)
        if not isinstance(messages, list):
            continue
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                continue
            for part in content:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "image":
                    refs += [part[k] for k in _PART_KEYS if part.get(k) is not None][:1]
                elif part.get("type") == "image_url" and isinstance(part.get("image_url"), dict):
                    refs.append(part["image_url"].get("url"))
    return refs


class ImageTokens:
    """Image tokens per row: each image's size read from its file header (Pillow opens lazily: no pixels are
    decoded), then the model's processor rule `tokens_of(width, height)`. Paths are relative to the dataset file."""

    def __init__(self, tokens_of, base: Path):
        self.tokens_of, self.base, self._sizes = tokens_of, base, {}

    def count(self, record: dict, where: str) -> int:
        return sum(self._tokens(ref, where) for ref in image_refs(record))

    def _tokens(self, ref, where: str) -> int:
        width, height = self._size(ref, where)
        try:
            return self.tokens_of(width, height)
        except ValueError as exc:            # Qwen's smart_resize refuses an aspect ratio above 200
            raise SourceError(f"{where}: image {shorten(_name(ref), 80)} ({width}x{height}): {exc}") from None

    def _size(self, ref, where: str) -> tuple[int, int]:
        import io

        try:
            from PIL import Image, UnidentifiedImageError
        except ImportError:
            raise MissingExtraError("image sizes need Pillow: pip install pillow") from None
        data = None
        if isinstance(ref, dict):
            data, ref = ref.get("bytes"), ref.get("path")
        if data is None:
            if not isinstance(ref, str) or not ref:
                raise SourceError(f"{where}: an image entry must be a path, got {shorten(ref, 40)}")
            if ref.startswith("data:"):
                import base64
                import binascii

                try:
                    data = base64.b64decode(ref.split(",", 1)[1], validate=True)
                except (IndexError, binascii.Error):
                    raise SourceError(f"{where}: image data: URL is not base64") from None
            elif ref.startswith(("http://", "https://")):
                raise SourceError(f"{where}: image {shorten(ref, 80)} is a URL: memfit reads image sizes from "
                                  f"local files only")
        if data is None and ref in self._sizes:        # a file many rows name is read once
            return self._sizes[ref]
        path = None if data is not None else (Path(ref).expanduser() if Path(ref).expanduser().is_absolute()
                                               else self.base / ref)
        try:
            with Image.open(io.BytesIO(data) if data is not None else path) as image:
                size = image.size
        except FileNotFoundError:
            raise SourceError(f"{where}: image {shorten(ref, 80)} not found (looked at {path})") from None
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            detail = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
            raise SourceError(f"{where}: image {shorten(_name(ref), 80)} is not a readable image ({detail})") from None
        if data is None:
            self._sizes[ref] = size
        return size


def _name(ref) -> str:
    return ref if isinstance(ref, str) and not ref.startswith("data:") else "(embedded bytes)"
