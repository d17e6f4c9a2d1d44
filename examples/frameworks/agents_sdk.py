"""The OpenAI Agents SDK through `agentmem serve`: an agent with a function tool, on the SDK's default model
(the Responses API) or its chat completions model. Every model call is stored in episode EPISODE.

    agentmem serve --model default --chat-template chatml_tools &
    python examples/frameworks/agents_sdk.py --api responses      # or --api chat
"""

from __future__ import annotations

import argparse

import httpx
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8001", help="the agentmem serve root URL")
    parser.add_argument("--model", default="default", help="the model name the server serves")
    parser.add_argument("--api", choices=["responses", "chat"], default="responses")
    parser.add_argument("--episode", default="agents-sdk")
    args = parser.parse_args()

    set_tracing_disabled(True)  # traces would go to OpenAI
    client = AsyncOpenAI(base_url=f"{args.server}/episodes/{args.episode}/v1", api_key="unused")
    if args.api == "responses":  # the SDK's default model: the Responses API of the default client
        set_default_openai_client(client)
        model = args.model
    else:
        model = OpenAIChatCompletionsModel(model=args.model, openai_client=client)
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[weather], model=model)
    answer = Runner.run_sync(agent, "What is the weather in Oslo?").final_output
    reward = float("sunny" in answer.lower())
    httpx.post(f"{args.server}/agentmem/episodes/{args.episode}/reward", json={"reward": reward}).raise_for_status()
    print(answer)


if __name__ == "__main__":
    main()
