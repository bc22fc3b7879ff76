import json
import os
import socket
import ssl
import subprocess
import sys

import openai
import pytest
import yaml

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import InputError
from storyrewrite.llm.backends import OpenAIBackend, describe_failure
from storyrewrite.llm.cache import ResponseCache
from storyrewrite.llm.modes import ExampleSource
from storyrewrite.llm.run import run_mode
from storyrewrite.params import LLMConfig, OpenAISettings, build, load_yaml

from chat_server import ChatServer
from helpers import ROOT, imported_modules

KEY = "sk-test-NEVER-WRITE-ME-1234"


def _config(url: str, **openai) -> LLMConfig:
    section = load_yaml(ROOT / "params.yaml")["llm"]
    section = {**section, "backend": "openai", "templates": {k: str(ROOT / v) for k, v in section["templates"].items()},
               "openai": {**section["openai"], "base_url": url, "model": "test-model", "concurrency": 1, **openai}}
    return build(LLMConfig, section, "llm")


def _backend(config: LLMConfig) -> OpenAIBackend:
    return OpenAIBackend(config.openai)


@pytest.fixture
def sleeps(monkeypatch) -> list:
    """The client's own back-off waits, recorded instead of slept."""
    import time as real_time

    from openai import _base_client

    waited = []

    class Clock:
        def __getattr__(self, name):
            return getattr(real_time, name)

        def sleep(self, seconds):
            waited.append(seconds)

    monkeypatch.setattr(_base_client, "time", Clock())
    return waited


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def test_request_body_and_the_clients_own_retries_on_429_and_500(key, small_prepared, sleeps):
    failures = [(429, {"Retry-After": "7"}), (500, {}), (503, {"retry-after-ms": "250"})]
    with ChatServer(failures=failures) as server:
        config = _config(server.url)
        backend = _backend(config)
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "line\nPremise: x\nEnd"}]
        reply = backend.complete(messages, max_new_tokens=50, temperature=0.0)
    # The retry count comes from the client (each response says how many retries it took).
    assert len(server.requests) == 4 and backend.retries == 3
    assert sleeps[0] == 7.0 and sleeps[2] == 0.25  # Retry-After and retry-after-ms honoured
    assert 0 < sleeps[1] <= 1.0  # jittered exponential back-off between
    assert [h["x-stainless-retry-count"] for h in server.headers] == ["0", "1", "2", "3"]
    body = server.requests[-1]
    assert body["model"] == "test-model" and body["messages"] == messages
    assert body["temperature"] == 0.0 and body["max_tokens"] == 50
    assert server.headers[-1]["authorization"] == f"Bearer {KEY}"
    assert reply.text == "Rewritten: Premise: x" and reply.completion_tokens == 5


def test_gives_up_after_max_retries(key, sleeps):
    with ChatServer(failures=[(500, {})] * 3) as server:
        backend = _backend(_config(server.url, max_retries=2))
        with pytest.raises(Exception, match="500"):
            backend.complete([{"role": "user", "content": "a\nb"}], 5, 0.0)
    assert len(server.requests) == 3


def test_a_request_that_times_out_is_retried(key, sleeps):
    with ChatServer(delays=[2.0]) as server:  # the first answer comes after the client's timeout
        backend = _backend(_config(server.url, timeout=0.5))
        reply = backend.complete([{"role": "user", "content": "a\nb"}], 5, 0.0)
    assert reply.text == "Rewritten: a" and backend.retries == 1 and len(sleeps) == 1


def test_missing_key_fails_at_once_naming_the_variable(monkeypatch):
    monkeypatch.delenv("MY_LLM_KEY", raising=False)
    with pytest.raises(InputError, match="the API key variable MY_LLM_KEY is not set"):
        OpenAIBackend(OpenAISettings(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="MY_LLM_KEY", timeout=1.0,
                                     max_retries=2, concurrency=1))


def test_an_interrupted_run_resumes_from_the_cache_without_repeating_a_request(key, tmp_path, small_prepared):
    instances = load_instances(small_prepared, "timetravel", "test")  # 6 instances, 2 stories
    train = load_instances(small_prepared, "timetravel", "train")
    stories = {row["story_id"] for row in instances}  # one input each, asked once for its three rewrites
    assert len(stories) > 1
    cache = ResponseCache(tmp_path / "cache")
    with ChatServer(fail_after=1) as server:  # the 2nd request fails (not retryable): the run stops
        config = _config(server.url)
        with pytest.raises(InputError, match=r"HTTP 400: scripted 400"):  # the server's 400, which the client does not retry
            run_mode("one_shot_random", instances, ExampleSource(train, "timetravel", config, 0), _backend(config), cache)
        assert server.successes == 1
        server.fail_after = None
        predictions, usage = run_mode("one_shot_random", instances, ExampleSource(train, "timetravel", config, 0),
                                      _backend(config), cache)
        # Another generation setting asks again (the same server and model): a reply is cached for
        # its settings, not for its prompt alone.
        for changed in ({"temperature": 0.7}, {"max_new_tokens": 17}):
            other = build(LLMConfig, {**config.model_dump(), **changed}, "llm")
            _, again = run_mode("one_shot_random", instances, ExampleSource(train, "timetravel", other, 0), _backend(other), cache)
            assert (again.cache_hits, again.requests) == (0, len(stories)), changed
    assert usage.cache_hits == 1 and usage.requests == len(stories) - 1
    assert server.successes == 3 * len(stories)  # every prompt answered once over both runs, and once for each other setting
    assert [p["id"] for p in predictions] == [r["id"] for r in instances]
    by_story = {}
    for row, prediction in zip(instances, predictions, strict=True):
        by_story.setdefault(row["story_id"], set()).add(prediction["prediction"])
    assert all(len(answers) == 1 for answers in by_story.values())


@pytest.mark.slow
def test_the_stage_never_writes_the_key_and_its_metrics_do_not_depend_on_the_cache(tmp_path, small_prepared):
    with ChatServer() as server:
        params = load_yaml(ROOT / "params.yaml")
        params["llm"] = {**params["llm"], "backend": "openai", "templates": {k: str(ROOT / v) for k, v in params["llm"]["templates"].items()},
                         "openai": {**params["llm"]["openai"], "base_url": server.url}}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

        def stage() -> tuple[dict, dict]:
            result = subprocess.run(
                [sys.executable, "-X", "importtime", str(ROOT / "stages" / "llm.py"), "--mode", "zero_shot", "--data", str(small_prepared),
                 "--index", "unused", "--local-model", "unused", "--cache", "cache", "--out", "predictions/llm_zero_shot.jsonl",
                 "--usage", "reports/llm/zero_shot.json", "--record", "reports/stages/llm-zero_shot.json"],
                cwd=tmp_path, env={**os.environ, "OPENAI_API_KEY": KEY}, capture_output=True, text=True, timeout=120,
            )
            assert result.returncode == 0, result.stderr[-2000:]
            assert KEY not in result.stdout + result.stderr
            # A remote backend runs no model here: the stage never imports torch or transformers.
            imported = imported_modules(result.stderr)
            assert "storyrewrite.llm.backends" in imported and not imported & {"torch", "transformers"}
            return (json.loads((tmp_path / "reports" / "llm" / "zero_shot.json").read_text()),
                    json.loads((tmp_path / "reports" / "stages" / "llm-zero_shot.json").read_text()))

        usage, record = stage()
        # 6 instances, 2 distinct stories = 2 prompts; the server counts 10 + 5 tokens a reply.
        assert {k: usage[k] for k in ("instances", "prompts", "prompt_tokens", "completion_tokens")} == {
            "instances": 6, "prompts": 2, "prompt_tokens": 20, "completion_tokens": 10}
        assert record["items"] == 2 and record["unit"] == "requests" and record["cache_hits"] == 0
        # The model ran on the server: the record names its host, and no dtype.
        assert (record["device"], record["device_name"], record["dtype"]) == ("remote", "127.0.0.1", None)
        # Again, every answer from the cache: the same metrics (DVC sees no change); the record
        # says what this run did.
        again, record = stage()
        assert again == usage and "requests" not in usage and "cache_hits" not in usage
        assert record["items"] == 0 and record["cache_hits"] == 2 and len(server.requests) == 2
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.parent.parent.name == "cache" for p in written)
    for path in written:
        assert KEY not in path.read_text(errors="replace"), path


def _refusing_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed: connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_refused_connection_is_one_line_naming_the_address_and_the_param(key, sleeps):
    url = f"http://127.0.0.1:{_refusing_port()}/v1"
    backend = _backend(_config(url, max_retries=1))
    with pytest.raises(InputError) as failure:
        backend.complete([{"role": "user", "content": "a\nb"}], 5, 0.0)
    assert str(failure.value) == (f"llm.openai: {url} (model test-model): connection refused (no server listening at that "
                                  "address and port), after 1 retries (llm.openai.max_retries); check llm.openai.base_url")
    assert len(sleeps) == 1  # the client retried first
    assert failure.value.__cause__ is None and failure.value.__suppress_context__


@pytest.mark.parametrize(("status", "says"), [
    (401, "the server refused the API key (401 Unauthorized); check the key in the variable OPENAI_API_KEY (llm.openai.api_key_env)"),
    (404, "404 Not Found: the server has no model 'test-model' or no chat completions at this address; check llm.openai.model"),
    (500, "the server failed (HTTP 500) after 1 retries (llm.openai.max_retries)"),
    (429, "still rate-limited (429 Too Many Requests) after 1 retries (llm.openai.max_retries); lower llm.openai.concurrency"),
])
def test_a_server_that_refuses_is_one_line_naming_what_to_check(key, sleeps, status, says):
    with ChatServer(failures=[(status, {})] * 2) as server:
        with pytest.raises(InputError) as failure:
            _backend(_config(server.url, max_retries=1)).complete([{"role": "user", "content": "a\nb"}], 5, 0.0)
    assert str(failure.value).startswith(f"llm.openai: {server.url} (model test-model): ") and says in str(failure.value)
    assert len(server.requests) == (2 if status >= 429 else 1)  # 401 and 404 are not retried


def test_dns_tls_and_timeout_failures_are_told_apart():
    import httpx2 as httpx  # the openai client's HTTP library

    settings = OpenAISettings(base_url="https://llm.example.invalid/v1", model="m", api_key_env="K", timeout=3.0, max_retries=2,
                              concurrency=1)
    request = httpx.Request("POST", settings.base_url)

    def connection_error(cause: BaseException) -> openai.APIConnectionError:
        error = openai.APIConnectionError(request=request)
        error.__cause__ = httpx.ConnectError(str(cause))
        error.__cause__.__cause__ = cause
        return error

    dns = describe_failure(connection_error(socket.gaierror(-2, "Name or service not known")), settings)
    assert dns.endswith("the host name 'llm.example.invalid' does not resolve (DNS), after 2 retries "
                        "(llm.openai.max_retries); check llm.openai.base_url")
    tls = describe_failure(connection_error(ssl.SSLCertVerificationError(1, "certificate verify failed")), settings)
    assert "the TLS handshake failed" in tls and tls.endswith("check llm.openai.base_url")
    timeout = describe_failure(openai.APITimeoutError(request=request), settings)
    assert timeout == ("llm.openai: https://llm.example.invalid/v1 (model m): no answer within 3.0 s, after 2 retries "
                       "(llm.openai.max_retries); check that the server is up, or raise llm.openai.timeout")


@pytest.mark.slow
def test_the_stage_ends_an_unreachable_server_with_one_line_and_keeps_cached_replies(tmp_path, small_prepared):
    params = load_yaml(ROOT / "params.yaml")
    url = f"http://127.0.0.1:{_refusing_port()}/v1"
    params["llm"] = {**params["llm"], "backend": "openai", "templates": {k: str(ROOT / v) for k, v in params["llm"]["templates"].items()},
                     "openai": {**params["llm"]["openai"], "base_url": url, "max_retries": 0}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kept.json").write_text("{}")  # a reply cached by an earlier run
    result = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "llm.py"), "--mode", "zero_shot", "--data", str(small_prepared), "--index", "unused",
         "--local-model", "unused", "--cache", "cache", "--out", "predictions/llm_zero_shot.jsonl", "--usage",
         "reports/llm/zero_shot.json", "--record", "reports/stages/llm-zero_shot.json"],
        cwd=tmp_path, env={**os.environ, "OPENAI_API_KEY": KEY}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: llm.openai: {url} (model {params['llm']['openai']['model']}): connection refused (no server listening at that "
        "address and port), after 0 retries (llm.openai.max_retries); check llm.openai.base_url")
    assert (tmp_path / "cache" / "kept.json").read_text() == "{}" and not (tmp_path / "predictions" / "llm_zero_shot.jsonl").exists()
