"""``agentmem serve``: an OpenAI-compatible HTTP endpoint that records every call as an exact invocation.

- ``protocol``: the request bodies (pydantic), the options refused, and OpenAI-style error bodies;
- ``sampler``: the ``Sampler`` protocol the three samplers share, and ``BatchSampler``: batches concurrent
  requests into backend calls (a short collection window), applies stop strings and computes OpenAI log-prob
  fields;
- ``engine_sampler``: continuous batching on an async engine (vLLM's): each request to the engine as it
  arrives, its tokens streamed as sampled;
- ``gateway``: gateway mode (``--upstream``): ``UpstreamSampler`` generates on upstream OpenAI servers;
- ``behind_gateway``: what a server does for a gateway in front of it (the record header, prompt log-probs);
- ``formatting``: OpenAI response bodies and SSE chunks from sampled choices;
- ``responses_api``: the Responses API's items as chat messages and back;
- ``tool_calls``: a reply's tool calls parsed into OpenAI ``tool_calls`` (transformers' response parsing);
- ``recorder``: the store side: the ``serve`` run, episodes from the client, one transaction per call;
- ``calls``: what every OpenAI route shares: request checks, generation, storing, streaming;
- ``routes``: one router per API (``chat``, ``completions``, ``responses``, ``models``, and agentmem's
  ``episodes``: reward and privileged);
- ``app``: the FastAPI app: the routers under ``/v1`` and the ``/episodes/{id}/v1`` prefix, ``/health``, the
  API key, OpenAI-shaped errors;
- ``server``: builds a server from its config (the one place ``agentmem serve`` builds from).
"""
