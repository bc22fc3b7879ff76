"""A disk cache of LLM responses, so that an interrupted run never repeats (or pays for) a call.

Key: sha256 of the backend, the model, the full messages and the generation settings. Each
entry is one small JSON file, written atomically; the API key is never part of it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from storyrewrite.io import read_json, write_json_atomic


def cache_key(backend: str, model: str, messages: list[dict], settings: dict) -> str:
    blob = json.dumps({"backend": backend, "model": model, "messages": messages, "settings": settings},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        path = self._path(key)
        return read_json(path) if path.exists() else None

    def put(self, key: str, entry: dict) -> None:
        write_json_atomic(self._path(key), entry)
