"""Chat backends: `openai` (any OpenAI-compatible chat-completions server) and `local` (a
transformers chat model, by default the bundled SmolLM2-135M-Instruct)."""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from storyrewrite.io import InputError


@dataclass
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int
    initial_delay: float  # seconds; doubled after each failed try, with jitter
    max_delay: float


class OpenAIBackend:
    """The official `openai` client against `base_url`: OpenAI, Gemini's OpenAI-compatible
    endpoint, vLLM, llama.cpp's server, Ollama. The key is read from the environment variable
    named in params, never from params; retries on rate limits (429), server errors (5xx),
    timeouts and dropped connections, with exponential back-off that honours Retry-After."""

    name = "openai"

    def __init__(self, base_url: str, model: str, api_key_env: str, timeout: float, retry: RetryPolicy,
                 sleep=time.sleep):
        key = os.environ.get(api_key_env)
        if not key:
            raise InputError(f"the API key variable {api_key_env} is not set (params `llm.openai.api_key_env`); "
                             f"export {api_key_env}=... before running the LLM stage")
        import openai

        self.openai = openai
        # Retries are ours (counted, logged, Retry-After honoured), not the client's.
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=0)
        self.model, self.retry, self.sleep = model, retry, sleep
        self.retries = 0

    def _delay(self, attempt: int, error: Exception) -> float:
        response = getattr(error, "response", None)
        retry_after = response.headers.get("retry-after") if response is not None else None
        if retry_after:
            try:
                return min(float(retry_after), self.retry.max_delay)
            except ValueError:
                pass
        return min(self.retry.initial_delay * 2**attempt, self.retry.max_delay) * (0.5 + random.random() / 2)

    def complete(self, messages: list[dict], max_new_tokens: int, temperature: float) -> Reply:
        retryable = (self.openai.RateLimitError, self.openai.InternalServerError,
                     self.openai.APITimeoutError, self.openai.APIConnectionError)
        for attempt in range(self.retry.max_retries + 1):
            try:
                response = self.client.chat.completions.create(
                    model=self.model, messages=messages, temperature=temperature, max_tokens=max_new_tokens)
            except retryable as error:
                if attempt == self.retry.max_retries:
                    raise
                self.retries += 1
                self.sleep(self._delay(attempt, error))
                continue
            usage = response.usage
            return Reply(response.choices[0].message.content or "",
                         usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0)
        raise AssertionError("unreachable")


class LocalBackend:
    """A transformers chat model with its chat template; temperature 0 is greedy decoding."""

    name = "local"

    def __init__(self, model_dir: str | Path):
        from storyrewrite.models.loading import load_model, load_tokenizer

        self.tokenizer = load_tokenizer(model_dir)
        if self.tokenizer.chat_template is None:
            raise InputError(f"{model_dir}: the local LLM backend needs a chat model (its tokenizer has no chat template)")
        self.model = load_model(model_dir).eval()
        self.seq2seq = bool(self.model.config.is_encoder_decoder)
        # A causal LM continues the prompt: pad on the left so that every prompt ends where
        # generation starts. An encoder reads absolute positions: pad on the right.
        self.tokenizer.padding_side = "right" if self.seq2seq else "left"

    def complete(self, messages: list[dict], max_new_tokens: int, temperature: float) -> Reply:
        return self.complete_many([messages], max_new_tokens, temperature)[0]

    @torch.inference_mode()
    def complete_many(self, batch: list[list[dict]], max_new_tokens: int, temperature: float) -> list[Reply]:
        prompts = [self.tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in batch]
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        output = self.model.generate(**inputs, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
                                     **sampling)
        new = output if self.seq2seq else output[:, inputs["input_ids"].shape[1]:]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        prompt_lengths = inputs["attention_mask"].sum(dim=1).tolist()
        new_lengths = (new != self.tokenizer.pad_token_id).sum(dim=1).tolist()
        return [Reply(t.strip(), p, n) for t, p, n in zip(texts, prompt_lengths, new_lengths)]
