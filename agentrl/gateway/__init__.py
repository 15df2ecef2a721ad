"""The OpenAI-compatible gateway: agents written against the OpenAI API (the `openai` SDK and
what is built on it) sample from the policy through `/v1/chat/completions` on 127.0.0.1, and
every call is recorded as token ids and sampler logprobs (docs/agents.md).

- `agentrl.gateway.record`: one agent run's calls as a tree of conversations, turned into
  trajectories without re-tokenising what the policy produced;
- `agentrl.gateway.protocol`: the request checks and the response shapes of the OpenAI API;
- `agentrl.gateway.server`: the HTTP server (Starlette on uvicorn) and the sessions that feed
  the engine;
- `agentrl.gateway.agents`: the user's `async def agent(client, task)` as an env (`--agent`);
- `agentrl.gateway.serve`: `agentrl serve --model DIR`.
"""
