"""An out-of-tree environment: ``riddles``, ``n_riddles`` fixed tasks whose answer is in the last chunk."""

from __future__ import annotations

from agentmem.records import Fact, Task
from envs.metrics import score_answer

NAMES = ["Oslo", "Paris", "Lyon", "Berlin"]


class RiddleEnv:
    name = "riddles"

    def __init__(self, count_tokens, chunk_tokens: int, seed: int, n_riddles: int = 3):
        self.seed, self.n_riddles = seed, n_riddles

    def tasks(self, n=None):
        out = []
        for i in range(self.n_riddles if n is None else min(n, self.n_riddles)):
            city = NAMES[(i + self.seed) % len(NAMES)]
            fact = f"Bob lives in {city}."
            out.append(Task(task_id=f"riddle-{i}", env=self.name, question="Where does Bob live?",
                            chunks=["Alice works in Berlin.", fact], answers=[city], evidence=[fact],
                            evidence_chunks=[1], facts=[Fact(text=fact, chunk=1)]))
        return out

    def score(self, prediction, task):
        return score_answer(prediction, task.answers)
