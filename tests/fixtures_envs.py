"""Small hand-written data files in each benchmark's official layout, written by the tests themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def words(text: str) -> int:
    """The tests' tokenizer: one token per white-space separated word."""
    return len(text.split())


def hotpotqa_records() -> list[dict[str, Any]]:
    def para(title: str, n: int) -> list[Any]:
        return [
            title,
            [f"{title} fact {k} is stated here." if k else f"{title} is a topic." for k in range(n)],
        ]

    return [
        {
            "_id": "hp1",
            "question": "Which city is the capital of Velo?",
            "answer": "Rasten",
            "type": "bridge",
            "level": "easy",
            "supporting_facts": [["Velo", 0], ["Rasten", 1], ["Rasten", 9]],  # 9: past the end, skipped
            "context": [
                ["Velo", ["Velo is a country whose capital is Rasten."]],
                ["Rasten", ["Rasten is a city.", " Rasten lies on a river."]],
                para("Mordo", 3),
                para("Kilmar", 2),
            ],
        },
        {
            "_id": "hp2",
            "question": "Were Anna Tol and Bo Rik both painters?",
            "answer": "yes",
            "type": "comparison",
            "level": "medium",
            "supporting_facts": [["Anna Tol", 0], ["Bo Rik", 0]],
            "context": [
                ["Anna Tol", ["Anna Tol was a painter."]],
                ["Bo Rik", ["Bo Rik was a painter too."]],
                para("Kilmar", 2),
                para("Sendo", 4),
            ],
        },
        {
            "_id": "hp3",
            "question": "What river runs through Sendo?",
            "answer": "the Vey",
            "type": "bridge",
            "level": "hard",
            "supporting_facts": [["Sendo", 2]],
            "context": [para("Sendo", 4), para("Lamar", 3), para("Tiro", 2)],
        },
    ]


def squad_records() -> dict[str, Any]:
    def para(context: str, qas: list[tuple[str, str, list[str]]]) -> dict[str, Any]:
        return {
            "context": context,
            "qas": [
                {
                    "id": qid,
                    "question": q,
                    "answers": [{"text": a, "answer_start": context.find(a)} for a in golds],
                }
                for qid, q, golds in qas
            ],
        }

    return {
        "version": "1.1",
        "data": [
            {
                "title": "Super_Bowl",
                "paragraphs": [
                    para(
                        "The Denver Broncos won the game. It was played in Santa Clara.",
                        [
                            ("sq1", "Who won?", ["Denver Broncos", "The Denver Broncos", "Denver Broncos"]),
                            ("sq2", "Where was it played?", ["Santa Clara"]),
                        ],
                    ),
                    para(
                        "The halftime show had Coldplay as the headliner.",
                        [("sq3", "Who headlined?", ["Coldplay"])],
                    ),
                ],
            },
            {
                "title": "Rivers",
                "paragraphs": [
                    para(
                        "The Rhine flows through six countries. " * 3,
                        [("sq4", "How many countries?", ["six"])],
                    ),
                    para("The Danube is long.", []),
                ],
            },
        ],
    }


def _turns(session: int, speakers: tuple[str, str], texts: list[str]) -> list[dict[str, Any]]:
    return [
        {"speaker": speakers[k % 2], "dia_id": f"D{session}:{k + 1}", "text": text}
        for k, text in enumerate(texts)
    ]


def locomo_records() -> list[dict[str, Any]]:
    people = ("Ana", "Ben")
    session_2 = _turns(2, people, ["I adopted a dog named Rex.", "Lovely! What breed?", "A beagle."])
    session_2[2]["blip_caption"] = "a photo of a beagle"
    return [
        {
            "sample_id": "conv-a",
            "conversation": {
                "speaker_a": "Ana",
                "speaker_b": "Ben",
                # out of order on purpose: sessions are sorted by number
                "session_2_date_time": "2:00 pm on 9 May, 2023",
                "session_2": session_2,
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": _turns(1, people, ["Hi Ben! I started painting.", "Great, what do you paint?"]),
                "session_3_date_time": "3:00 pm on 1 June, 2023",  # a date with no session: ignored
            },
            "qa": [
                {
                    "question": "What is Ana's dog called?",
                    "answer": "Rex",
                    "evidence": ["D2:1"],
                    "category": 4,
                },
                {
                    "question": "When did Ana adopt a dog?",
                    "answer": "9 May 2023; a Tuesday",
                    "evidence": ["D2:1"],
                    "category": 3,
                },
                {
                    "question": "What does Ana do?",
                    "answer": "painting, adopting",
                    "evidence": ["D1:1; D2:1"],
                    "category": 1,
                },
                {
                    "question": "What is Ben's cat called?",
                    "adversarial_answer": "Rex",
                    "evidence": ["D2:1"],
                    "category": 5,
                },
                {"question": "How many dogs?", "answer": 1, "evidence": ["D2:1", "D9:9"], "category": 2},
            ],
            "event_summary": {},
            "observation": {},
            "session_summary": {},
        },
        {
            "sample_id": "conv-b",
            "conversation": {
                "speaker_a": "Cy",
                "speaker_b": "Di",
                "session_1_date_time": "9:00 am on 1 March, 2022",
                "session_1": _turns(1, ("Cy", "Di"), ["I moved to Oslo.", "Nice city!"] * 4),
            },
            "qa": [{"question": "Where did Cy move?", "answer": "Oslo", "evidence": ["D1:1"], "category": 4}],
        },
    ]


def longmemeval_records() -> list[dict[str, Any]]:
    def turns(*pairs: tuple[str, bool]) -> list[dict[str, Any]]:
        return [
            {"role": "user" if k % 2 == 0 else "assistant", "content": text, "has_answer": mark}
            for k, (text, mark) in enumerate(pairs)
        ]

    return [
        {
            "question_id": "lm1",
            "question_type": "knowledge-update",
            "question": "How much did I earn at the market?",
            "answer": "$420",
            "question_date": "2023/10/02 (Mon) 04:40",
            "haystack_dates": ["2023/09/30 (Sat) 08:34", "2023/04/11 (Tue) 07:47"],
            "haystack_session_ids": ["answer_1", "other_1"],
            "haystack_sessions": [
                turns(("I earned $420 at the market today.", True), ("Well done!", False)),
                turns(("Any tips for baking bread?", False), ("Use a hot oven and good flour.", False)),
            ],
            "answer_session_ids": ["answer_1"],
        },
        {
            "question_id": "lm2",
            "question_type": "temporal-reasoning",
            "question": "How many books have I read?",
            "answer": 3,
            "question_date": "2023/01/30 (Mon) 01:51",
            "haystack_dates": ["2023/01/05 (Thu) 12:34"],
            "haystack_session_ids": ["answer_2"],
            "haystack_sessions": [turns(("I have read three books this month.", False), ("Nice.", False))],
            "answer_session_ids": ["answer_2"],
        },
        {
            "question_id": "lm3_abs",
            "question_type": "single-session-user",
            "question": "What is my cat's name?",
            "answer": "You did not mention a cat.",
            "question_date": "2023/03/01 (Wed) 10:00",
            "haystack_dates": ["2023/02/01 (Wed) 10:00", "2023/02/02 (Thu) 10:00"],
            "haystack_session_ids": ["s3a", "s3b"],
            "haystack_sessions": [
                turns(
                    ("My dog is called Rex and he is loud in the morning.", False), ("Dogs are fun.", False)
                ),
                turns(("I like tea.", False)),
            ],
            "answer_session_ids": ["s3a"],
        },
    ]


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_fixture(name: str, folder: Path) -> Path | None:
    """Write ``name``'s fixture into ``folder``; None for the synthetic env, which reads no file."""
    data = {
        "hotpotqa": hotpotqa_records,
        "squad": squad_records,
        "locomo": locomo_records,
        "longmemeval": longmemeval_records,
    }
    if name == "synthetic":
        return None
    return write_json(folder / f"{name}.json", data[name]())
