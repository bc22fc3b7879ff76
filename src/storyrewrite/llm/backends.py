"""Chat backends behind one small interface: `complete_many` answers a batch of chat prompts and
yields each reply as it is ready, so that the caller caches every answer at once.

- `openai`: any OpenAI-compatible chat-completions server (OpenAI, Gemini's compatible
  endpoint, vLLM, llama.cpp's server, Ollama), `llm.openai.concurrency` requests at a time;
- `local`: a transformers chat model (by default the bundled SmolLM2-135M-Instruct), batched.

`make_backend(config, ...)` builds the one the params name.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from storyrewrite.io import InputError
from storyrewrite.params import LLMConfig, OpenAISettings


@dataclass
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float  # wall time of the request (a batch's time shared by its prompts)


class Backend(Protocol):
    name: str  # in the cache key
    model_id: str  # what identifies the model in the cache key (a URL and name, or a weights digest)
    label: str  # the model as the report names it
    batch_size: int  # prompts handed to complete_many at once
    device: object  # where the model runs: a torch.device, or "remote HOST" (records.describe_device)

    def complete_many(self, prompts: list[list[dict]], max_new_tokens: int, temperature: float) -> Iterator[tuple[int, Reply]]:
        """(position in `prompts`, reply) for every prompt, in the order they finish."""

    @property
    def retries(self) -> int: ...


class OpenAIBackend:
    """The official `openai` client against `settings.base_url`. The key is read from the
    environment variable named in params, never from params. Retries are the client's own
    (`llm.openai.max_retries`): timeouts, dropped connections, 408/409/429 and 5xx, with
    jittered exponential back-off that honours `retry-after`/`retry-after-ms`; each response
    says how many retries it took, and the backend counts them."""

    name = "openai"

    def __init__(self, settings: OpenAISettings):
        key = os.environ.get(settings.api_key_env)
        if not key:
            raise InputError(f"the API key variable {settings.api_key_env} is not set (params `llm.openai.api_key_env`); "
                             f"export {settings.api_key_env}=... before running the LLM stage")
        import openai

        self.client = openai.OpenAI(base_url=settings.base_url, api_key=key, timeout=settings.timeout,
                                    max_retries=settings.max_retries)
        self.settings = settings
        self.model_id, self.label = f"{settings.base_url} {settings.model}", settings.model
        self.batch_size = 16 * settings.concurrency
        # The model runs on the server: the stage record names its host (no credentials, no port).
        self.device = f"remote {urlsplit(settings.base_url).hostname or settings.base_url}"
        self._retries, self._lock = 0, threading.Lock()  # counted from the worker threads

    @property
    def retries(self) -> int:
        return self._retries

    def complete(self, messages: list[dict], max_new_tokens: int, temperature: float) -> Reply:
        import openai

        started = time.perf_counter()
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=self.settings.model, messages=messages, temperature=temperature, max_tokens=max_new_tokens)
        except openai.APIError as error:  # the client has retried what it retries
            raise InputError(describe_failure(error, self.settings)) from None
        with self._lock:
            self._retries += raw.retries_taken
        response = raw.parse()
        usage = response.usage
        return Reply(response.choices[0].message.content or "", usage.prompt_tokens if usage else 0,
                     usage.completion_tokens if usage else 0, time.perf_counter() - started)

    def complete_many(self, prompts: list[list[dict]], max_new_tokens: int, temperature: float) -> Iterator[tuple[int, Reply]]:
        pool = ThreadPoolExecutor(max_workers=self.settings.concurrency)
        try:
            futures = {pool.submit(self.complete, m, max_new_tokens, temperature): i for i, m in enumerate(prompts)}
            for future in as_completed(futures):
                yield futures[future], future.result()  # result() re-raises a request's failure
        finally:
            # After a failure (or an interruption) the queued requests are not sent: nothing is paid twice.
            pool.shutdown(wait=True, cancel_futures=True)


def _causes(error: BaseException) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def describe_failure(error: Exception, settings: OpenAISettings) -> str:
    """One line for a failed chat request: the server, the model, what failed, and the param or
    variable to check (the `llm` stage prints it and exits 2)."""
    import ssl
    import socket

    import openai

    where = f"llm.openai: {settings.base_url} (model {settings.model})"
    retried = f"after {settings.max_retries} retries (llm.openai.max_retries)"
    if isinstance(error, openai.APITimeoutError):
        return (f"{where}: no answer within {settings.timeout} s, {retried}; check that the server is up, or raise "
                f"llm.openai.timeout")
    if isinstance(error, openai.APIConnectionError):
        causes = list(_causes(error))
        text = " ".join(str(cause) for cause in causes).lower()
        if any(isinstance(cause, ssl.SSLError) for cause in causes) or "certificate" in text or "ssl" in text:
            what = "the TLS handshake failed (a certificate the client does not trust, or http:// served as https://)"
        elif any(isinstance(cause, socket.gaierror) for cause in causes) or "name or service not known" in text \
                or "nodename nor servname" in text or "name resolution" in text:
            what = f"the host name {urlsplit(settings.base_url).hostname!r} does not resolve (DNS)"
        elif any(isinstance(cause, ConnectionRefusedError) for cause in causes) or "refused" in text:
            what = "connection refused (no server listening at that address and port)"
        else:
            what = f"cannot connect ({causes[-1].__class__.__name__}: {causes[-1]})"
        return f"{where}: {what}, {retried}; check llm.openai.base_url"
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        if status == 401:
            return (f"{where}: the server refused the API key (401 Unauthorized); check the key in the variable "
                    f"{settings.api_key_env} (llm.openai.api_key_env)")
        if status == 403:
            return (f"{where}: the API key may not use this model (403 Forbidden); check {settings.api_key_env} "
                    f"(llm.openai.api_key_env) and llm.openai.model")
        if status == 404:
            return (f"{where}: 404 Not Found: the server has no model {settings.model!r} or no chat completions at this "
                    f"address; check llm.openai.model and llm.openai.base_url (often ending in /v1)")
        if status == 429:
            return (f"{where}: still rate-limited (429 Too Many Requests) {retried}; lower llm.openai.concurrency or "
                    f"raise llm.openai.max_retries")
        if status >= 500:
            return f"{where}: the server failed (HTTP {status}) {retried}; the server's own error, try again later"
        body = error.body if isinstance(error.body, dict) else {}
        nested = body.get("error") if isinstance(body.get("error"), dict) else {}
        message = body.get("message") or nested.get("message") or error.message
        return f"{where}: the server refused the request (HTTP {status}: {message}); check llm.openai and llm.templates"
    return f"{where}: {error.__class__.__name__}: {error}"


class LocalBackend:
    """A transformers chat model with its chat template; temperature 0 is greedy decoding. Its
    weights are loaded on the first prompt the response cache could not answer (`model`): a
    rerun that finds every reply cached loads none."""

    name = "local"
    retries = 0

    def __init__(self, model_dir: str | Path, label: str, batch_size: int = 8, device: str = "cpu", dtype: str = "float32"):
        from storyrewrite.models.device import resolve_device
        from storyrewrite.models.store import is_seq2seq, load_tokenizer, weights_digest

        self.tokenizer = load_tokenizer(model_dir)
        if self.tokenizer.chat_template is None:
            raise InputError(f"{model_dir}: the local LLM backend needs a chat model (its tokenizer has no chat template)")
        self.model_dir, self.device, self.dtype = Path(model_dir), resolve_device(device), dtype
        self.seq2seq = is_seq2seq(model_dir)
        # A causal LM continues the prompt: pad on the left so that every prompt ends where
        # generation starts. An encoder reads absolute positions: pad on the right.
        self.tokenizer.padding_side = "right" if self.seq2seq else "left"
        # The dtype changes the answers (bf16 rounding), so it is part of the model's identity.
        precision = "" if dtype == "float32" else f" {dtype}"
        self.model_id, self.label, self.batch_size = f"local {weights_digest(model_dir)}{precision}", label, batch_size

    @functools.cached_property
    def model(self):
        from storyrewrite.models.store import load_model

        return load_model(self.model_dir, dtype=self.dtype, device=self.device).eval()

    @property
    def loaded(self) -> bool:
        """Whether the weights have been loaded (a prompt went to the model)."""
        return "model" in vars(self)

    def complete(self, messages: list[dict], max_new_tokens: int, temperature: float) -> Reply:
        return next(self.complete_many([messages], max_new_tokens, temperature))[1]

    def encode(self, prompts: list[list[dict]]):
        """The chat prompts as the model reads them: its chat template with the generation prompt,
        tokenized into one padded batch (on the CPU)."""
        texts = [self.tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in prompts]
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def complete_many(self, prompts: list[list[dict]], max_new_tokens: int, temperature: float) -> Iterator[tuple[int, Reply]]:
        import torch

        from storyrewrite.models.encoding import generated_tokens

        started = time.perf_counter()
        inputs = self.encode(prompts).to(self.model.device)
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.inference_mode():
            output = self.model.generate(**inputs, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
                                         **sampling)
        new = generated_tokens(output, inputs["input_ids"], self.seq2seq)
        answers = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        prompt_lengths = inputs["attention_mask"].sum(dim=1).tolist()
        new_lengths = reply_lengths(new, self.model.generation_config, max_new_tokens)
        seconds = (time.perf_counter() - started) / len(prompts)
        for i, (text, p, n) in enumerate(zip(answers, prompt_lengths, new_lengths, strict=True)):
            yield i, Reply(text.strip(), p, n, seconds)


def reply_lengths(new, generation_config, max_new_tokens: int) -> list[int]:
    """The tokens of each reply in a batch of generated rows `new` (a tensor): those before the
    row's first end token (`generation_config.eos_token_id`, one id or several), as a causal chat
    model's end token is often its pad token too and a row that ends sooner is padded after it.
    A model that forces an end token at the limit (`forced_eos_token_id`, BART's) puts one in the
    last place of a reply that used every token: such a reply counts all `max_new_tokens`."""
    import torch

    ends = generation_config.eos_token_id
    ends = torch.tensor([] if ends is None else [ends] if isinstance(ends, int) else list(ends), dtype=new.dtype, device=new.device)
    ended = torch.isin(new, ends)
    lengths = torch.where(ended.any(dim=1), ended.int().argmax(dim=1), new.shape[1])
    if generation_config.forced_eos_token_id is not None and new.shape[1] == max_new_tokens:
        lengths = torch.where(lengths == max_new_tokens - 1, max_new_tokens, lengths)
    return lengths.tolist()


def make_backend(config: LLMConfig, local_models: Path, local_label: str, device: str) -> Backend:
    """The backend `llm.backend` names: `openai` (settings `llm.openai`) or `local` (the
    generator of the models stage's directory `local_models`, named `local_label`, on `device`)."""
    if config.backend == "openai":
        return OpenAIBackend(config.openai)
    from storyrewrite.models.store import resolve_model_dir

    return LocalBackend(resolve_model_dir(local_models, "generator"), local_label, config.local_batch_size, device,
                        config.local_dtype)
