"""Request fields the gateway does not sample with are no longer ignored silently (probe
defect): each one it cannot honour (`response_format`, penalties, `logit_bias`, `top_logprobs`,
...) is refused with an OpenAI-style 400 naming it when set to anything but its neutral value,
which SDKs send and which keeps working; `seed` (`agentrl serve`), `logprobs`,
`stream_options.include_usage` and `parallel_tool_calls: false` are honoured. Real `openai` SDK
and real HTTP on 127.0.0.1; a real tiny model where the samples matter."""

from __future__ import annotations

import httpx
import openai
import pytest

from agentrl.gateway.protocol import UNSUPPORTED, parse_request
from agentrl.gateway.record import RunRecord
from agentrl.gateway.serve import start
from agentrl.gateway.server import RunState, Session
from agentrl.rollout.chat import renderer_for
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine
from agentrl_tools.parser import get_parser

HI = [{"role": "user", "content": "hi"}]
REFUSED = {  # a non-neutral value of every field of UNSUPPORTED
    "response_format": {"type": "json_object"}, "presence_penalty": 0.5, "frequency_penalty": -1,
    "repetition_penalty": 1.2, "logit_bias": {"5": 10}, "top_logprobs": 3, "top_k": 5,
    "min_p": 0.1, "functions": [{"name": "f"}], "function_call": "auto",
    "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"},
}
NEUTRAL = {  # what SDKs send by default, all accepted
    "response_format": {"type": "text"}, "presence_penalty": 0, "frequency_penalty": 0.0,
    "repetition_penalty": 1, "logit_bias": {}, "top_logprobs": 0, "top_k": -1, "min_p": 0,
    "functions": None, "function_call": None, "modalities": ["text"], "audio": None,
    "logprobs": False, "n": 1, "seed": None, "stream_options": None, "parallel_tool_calls": True,
    "user": "u1", "metadata": {"k": "v"}, "store": False,
}


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer):
    served = start("m", engine=ScriptedEngine(tiny_tokenizer, lambda ids: "ok"), tokenizer=tiny_tokenizer)
    yield served
    served.close()


@pytest.fixture(scope="module")
def real(tiny_model_dir):
    served = start(tiny_model_dir, max_tokens=12)
    yield served
    served.close()


def test_every_unsupported_field_is_refused_with_400_naming_it(scripted):
    assert set(REFUSED) == set(UNSUPPORTED)
    for key, value in REFUSED.items():
        r = httpx.post(f"{scripted.url}/chat/completions", timeout=30,
                       json={"model": "policy", "messages": HI, key: value})
        assert r.status_code == 400, (key, r.text)
        err = r.json()["error"]
        assert err["param"] == key and err["type"] == "invalid_request_error", err
        assert err["message"].startswith(f"'{key}' ") and "is not supported by this server" in err["message"]
    client = openai.OpenAI(base_url=scripted.url, api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="response_format") as e:
        client.chat.completions.create(model="policy", messages=HI, response_format={"type": "json_object"})
    assert e.value.param == "response_format"


def test_neutral_values_are_accepted(scripted):
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=30,
                   json={"model": "policy", "messages": HI, **NEUTRAL})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "ok"
    assert r.json()["choices"][0]["logprobs"] is None
    client = openai.OpenAI(base_url=scripted.url, api_key="k", max_retries=0)
    out = client.chat.completions.create(model="policy", messages=HI, presence_penalty=0, frequency_penalty=0,
                                         logprobs=False, n=1, response_format={"type": "text"}, logit_bias={})
    assert out.choices[0].message.content == "ok"


@pytest.mark.parametrize("key,value", [("seed", 1.5), ("seed", 2**64), ("logprobs", "yes"),
                                       ("stream_options", {"include_usage": 1}),
                                       ("parallel_tool_calls", "no")])
def test_malformed_honoured_fields_are_400(key, value):
    from agentrl.gateway.protocol import GatewayError

    with pytest.raises(GatewayError) as e:
        parse_request({"model": "policy", "messages": HI, key: value})
    assert e.value.status == 400 and e.value.param == key


def test_seed_gives_the_same_reply_and_logprobs_are_the_engine_s(real):
    """`agentrl serve`: a request's seed is its sampler's seed (the same reply twice, another with
    another seed), and `logprobs: true` returns the sampler's logprob of every sampled id."""
    client = openai.OpenAI(base_url=real.url, api_key="k", max_retries=0)

    def ask(seed):
        return client.chat.completions.create(model="policy", messages=HI, temperature=1.0, seed=seed,
                                              logprobs=True, max_tokens=12)

    a, b, c = ask(7), ask(7), ask(8)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert [t.logprob for t in a.choices[0].logprobs.content] == [t.logprob for t in b.choices[0].logprobs.content]
    assert [t.token for t in a.choices[0].logprobs.content] != [t.token for t in c.choices[0].logprobs.content]
    # the engine's own sample of that prompt with that seed: the same ids and logprobs
    s = real.session
    prompt = RunRecord(s.renderer, 4095).prepare(HI, None).prompt_ids
    [comp] = s.engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=12, seed=7,
                                                        stop_token_ids=list(s.renderer.stop_ids)))
    content = a.choices[0].logprobs.content
    assert [t.logprob for t in content] == pytest.approx(comp.logprobs, abs=1e-6)
    tok = s.renderer.tokenizer
    assert [t.token for t in content] == [tok.decode([i], skip_special_tokens=False) for i in comp.token_ids]
    assert len(content) == a.usage.completion_tokens and all(t.top_logprobs == [] for t in content)
    assert all(bytes(t.bytes).decode("utf-8") == t.token for t in content)


def test_stream_with_usage_and_logprobs(scripted):
    client = openai.OpenAI(base_url=scripted.url, api_key="k", max_retries=0)
    chunks = list(client.chat.completions.create(model="policy", messages=HI, stream=True, logprobs=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.content == "ok"
    assert [t.logprob for t in chunks[0].choices[0].logprobs.content] == [0.0] * chunks[-1].usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens > 0
    plain = list(client.chat.completions.create(model="policy", messages=HI, stream=True))
    assert all(ch.usage is None for ch in plain) and plain[-1].choices  # no usage chunk unasked


def test_parallel_tool_calls_false_returns_the_first_call(tiny_tokenizer):
    calls = ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
             '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>')
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    served = start("m", engine=ScriptedEngine(tiny_tokenizer, lambda ids: calls), tokenizer=tiny_tokenizer,
                   tool_parser="hermes")
    try:
        client = openai.OpenAI(base_url=served.url, api_key="k", max_retries=0)
        both = client.chat.completions.create(model="policy", messages=HI, tools=tools)
        one = client.chat.completions.create(model="policy", messages=HI, tools=tools, parallel_tool_calls=False)
    finally:
        served.close()
    assert [c.function.arguments for c in both.choices[0].message.tool_calls] == ['{"a": 1}', '{"a": 2}']
    assert [c.function.arguments for c in one.choices[0].message.tool_calls] == ['{"a": 1}']


def test_in_training_the_run_seed_decides(tiny_tokenizer):
    """A training session has its own seed (every run's rows seeded apart): a request's `seed`
    does not replace it (G runs asking seed 42 would sample one answer G times)."""
    r = renderer_for(tiny_tokenizer)
    args = dict(model_names=["policy"], max_episode_tokens=512, max_tokens=8)
    engine = ScriptedEngine(tiny_tokenizer, lambda ids: "ok")
    req = parse_request({"model": "policy", "messages": HI, "seed": 42})
    for seed, want in ((0, None), (None, 42)):
        s = Session(engine, r, get_parser("hermes"), seed=seed, **args)
        assert s._submit(RunState("t", s, None), [1, 2], req).seed == want
