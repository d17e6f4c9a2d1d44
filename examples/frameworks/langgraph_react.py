"""LangGraph's prebuilt ReAct agent through `agentmem serve`: `ChatOpenAI` pointed at the server, one tool.
Every model call of the graph is stored in episode EPISODE.

    agentmem serve --model default --chat-template chatml_tools &
    python examples/frameworks/langgraph_react.py
"""

from __future__ import annotations

import argparse

import httpx
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8001", help="the agentmem serve root URL")
    parser.add_argument("--model", default="default", help="the model name the server serves")
    parser.add_argument("--episode", default="langgraph")
    args = parser.parse_args()

    llm = ChatOpenAI(model=args.model, base_url=f"{args.server}/episodes/{args.episode}/v1", api_key="unused",
                     temperature=0, max_tokens=128)
    agent = create_react_agent(llm, [weather])
    state = agent.invoke({"messages": [("user", "What is the weather in Oslo?")]})
    answer = state["messages"][-1].content
    reward = float("sunny" in answer.lower())
    httpx.post(f"{args.server}/agentmem/episodes/{args.episode}/reward", json={"reward": reward}).raise_for_status()
    print(answer)


if __name__ == "__main__":
    main()
