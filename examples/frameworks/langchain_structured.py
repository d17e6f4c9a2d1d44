"""LangChain's structured output through `agentmem serve`: `ChatOpenAI.with_structured_output` with each of
its methods (`json_schema`: response_format json_schema; `function_calling`: a forced tool call; `json_mode`:
response_format json_object), which the server decodes under the matching constraint.

    agentmem serve --model default --chat-template chatml_tools &
    python examples/frameworks/langchain_structured.py --method json_schema
"""

from __future__ import annotations

import argparse

from langchain_openai import ChatOpenAI
from pydantic import BaseModel


class Weather(BaseModel):
    city: str
    weather: str


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8001", help="the agentmem serve root URL")
    parser.add_argument("--model", default="default", help="the model name the server serves")
    parser.add_argument("--method", choices=["json_schema", "function_calling", "json_mode"], default="json_schema")
    parser.add_argument("--episode", default="structured")
    args = parser.parse_args()

    llm = ChatOpenAI(model=args.model, base_url=f"{args.server}/episodes/{args.episode}/v1", api_key="unused",
                     temperature=0, max_tokens=128)
    structured = llm.with_structured_output(Weather, method=args.method)
    print(structured.invoke("The weather in Oslo is sunny. Reply in JSON with the city and its weather.")
          .model_dump_json())


if __name__ == "__main__":
    main()
