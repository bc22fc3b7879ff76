"""Exact cosine nearest-neighbour retrieval of training examples for RAG, from the index the
llm_index stage builds (storyrewrite.llm.indexing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from storyrewrite.data.schema import TASK_INPUT_FIELDS
from storyrewrite.io import InputError, read_json


def query_text(instance: dict, task: str) -> str:
    """What is embedded for an instance: the task's input fields (the counterfactual included)."""
    return " ".join(instance[f] for f in TASK_INPUT_FIELDS[task])


class Index:
    def __init__(self, directory: str | Path):
        directory = Path(directory)
        if (directory / "unbuilt.json").exists():
            raise InputError(f"{directory}: the retrieval index was not built ({read_json(directory / 'unbuilt.json')['reason']}); "
                             "run `dvc repro llm_index` with a retrieving mode in `llm.modes`")
        self.embeddings = np.load(directory / "embeddings.npy")
        self.ids = read_json(directory / "ids.json")

    def nearest(self, queries) -> list[str]:
        """Id of the training example with the highest cosine similarity to each query (N×d unit
        rows, a tensor or an array)."""
        return [self.ids[i] for i in np.argmax(np.asarray(queries) @ self.embeddings.T, axis=1)]
