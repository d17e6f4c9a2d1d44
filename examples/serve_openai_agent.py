"""A memory agent written with nothing but the `openai` client, recorded by `agentmem serve`.

The agent reads a long text one chunk per call, rewriting a short memory each time, then answers from
the memory alone: MemAgent's loop as any outside code would write it. Only its base URL knows about
agentmem: `http://HOST:PORT/episodes/EPISODE/v1` groups each task's calls into one episode, and one POST
gives the episode its reward. See docs/serve.md.

    agentmem serve --model default --run-name demo &          # in another terminal
    python examples/serve_openai_agent.py --server http://127.0.0.1:8001 --model default
"""

from __future__ import annotations

import argparse
import re
import uuid

import httpx
import openai

TASKS = [
    {"question": "Where does Bob live?", "answer": "Oslo",
     "chunks": ["Alice was born in Lyon and works in Berlin.", "Bob moved last year.",
                "Bob lives in Oslo now, near the harbour.", "Carol teaches in Rome."]},
    {"question": "Where was Alice born?", "answer": "Lyon",
     "chunks": ["Carol teaches in Rome.", "Alice was born in Lyon.", "Alice works in Berlin."]},
]
SYSTEM = "You keep a short memory of facts that help answer the question."


def f1(prediction: str, gold: str) -> float:
    p, g = re.findall(r"\w+", prediction.lower()), re.findall(r"\w+", gold.lower())
    common = sum(min(p.count(w), g.count(w)) for w in set(g))
    if not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def run_task(server: str, model: str, task: dict, episode: str, max_tokens: int) -> float:
    client = openai.OpenAI(base_url=f"{server}/episodes/{episode}/v1", api_key="unused")
    memory = "(empty)"
    for chunk in task["chunks"]:
        reply = client.chat.completions.create(
            model=model, max_tokens=max_tokens, temperature=1.0,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": f"Question: {task['question']}\nMemory: {memory}\nChunk: {chunk}\n"
                                                  "Write the updated memory."}],
            extra_headers={"X-Agentmem-Kind": "memory_update", "X-Agentmem-Task": task["question"]})
        memory = reply.choices[0].message.content.strip() or "(empty)"
    answer = client.chat.completions.create(
        model=model, max_tokens=max_tokens, temperature=1.0,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": f"Question: {task['question']}\nMemory: {memory}\nAnswer briefly."}],
        extra_headers={"X-Agentmem-Kind": "answer", "X-Agentmem-Task": task["question"]},
    ).choices[0].message.content
    score = f1(answer, task["answer"])
    httpx.post(f"{server}/agentmem/episodes/{episode}/reward",
               json={"reward": score, "metrics": {"f1": score}, "prediction": answer}).raise_for_status()
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8001", help="the agentmem serve root URL")
    parser.add_argument("--model", default="default", help="the model name the server serves")
    parser.add_argument("--samples", type=int, default=2, help="episodes per task (a GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    for task in TASKS:
        for _ in range(args.samples):
            episode = uuid.uuid4().hex[:12]
            score = run_task(args.server, args.model, task, episode, args.max_tokens)
            print(f"episode {episode}  {task['question']!r}  f1={score:.2f}")


if __name__ == "__main__":
    main()
