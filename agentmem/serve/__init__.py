"""``agentmem serve``: an OpenAI-compatible HTTP endpoint that records every call as an exact invocation.

- ``protocol``: the request bodies (pydantic), the options refused, and OpenAI-style error bodies;
- ``sampler``: batches concurrent requests into backend calls (a short collection window), applies stop
  strings and computes OpenAI log-prob fields;
- ``engine_sampler``: continuous batching on an async engine (vLLM's): each request to the engine as it
  arrives, its tokens streamed as sampled;
- ``tool_calls``: a reply's tool calls parsed into OpenAI ``tool_calls`` (transformers' response parsing);
- ``recorder``: the store side: the ``serve`` run, episodes from the client, one transaction per call;
- ``calls``: what every OpenAI route shares: request checks, generation, storing, streaming;
- ``routes``: one router per API (``chat``, ``completions``, ``models``, and agentmem's ``episodes``: reward
  and privileged);
- ``app``: the FastAPI app: the routers under ``/v1`` and the ``/episodes/{id}/v1`` prefix, ``/health``, the
  API key, OpenAI-shaped errors;
- ``client``: ``OpenAIBackend``, the agent loop's backend speaking to such a server.
"""
