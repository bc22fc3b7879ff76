"""LLM baselines: prompting modes, backends (OpenAI-compatible server or a local chat model),
retrieval for RAG, and a disk cache of every response."""
