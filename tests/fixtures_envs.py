"""Small hand-written data files in each benchmark's official layout, written by the tests themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envs import load_env


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


def ruler_hotpotqa_records() -> list[dict[str, Any]]:
    """The HotpotQA records plus 14 more of three paragraphs each: 51 distinct titles, so the default
    ``docs=50`` fits."""
    extra = [
        {
            "_id": f"hpx{k}",
            "question": f"What is filler question {k} about?",
            "answer": f"topic {k}",
            "type": "bridge",
            "level": "easy",
            "supporting_facts": [[f"Filler {k}a", 0], [f"Filler {k}b", 0]],
            "context": [[f"Filler {k}{x}", [f"Filler {k}{x} is about topic {k}."]] for x in "abc"],
        }
        for k in range(14)
    ]
    return hotpotqa_records() + extra


def twowiki_records() -> list[dict[str, Any]]:
    return [
        {
            "_id": "2w1",
            "type": "compositional",
            "question": "Who is the mother of the director of film Polish Blood?",
            "answer": "Maria Rom",
            "context": [
                ["Polish Blood", ["Polish Blood is a 1934 film.", " It was directed by Karel Lamac."]],
                ["Karel Lamac", ["Karel Lamac was a Czech director.", " His mother was Maria Rom."]],
                ["Lake Ovo", ["Lake Ovo is a lake.", " It is deep."]],
            ],
            "supporting_facts": [["Polish Blood", 1], ["Karel Lamac", 1]],
            "evidences": [["Polish Blood", "director", "Karel Lamac"], ["Karel Lamac", "mother", "Maria Rom"]],
        },
        {
            "_id": "2w2",
            "type": "comparison",
            "question": "Which film came out first, Alpha or Beta?",
            "answer": "Alpha",
            "context": [
                ["Alpha", ["Alpha is a 1920 film."]],
                ["Beta", ["Beta is a 1950 film."]],
                ["Gamma", ["Gamma is a 1990 film.", " It is long."]],
            ],
            "supporting_facts": [["Alpha", 0], ["Beta", 0]],
            "evidences": [["Alpha", "publication date", "1920"], ["Beta", "publication date", "1950"]],
        },
        {
            "_id": "2w3",
            "type": "bridge_comparison",
            "question": "Are the directors of Alpha and Beta from the same country?",
            "answer": "no",
            "context": [
                ["Alpha", ["Alpha is a 1920 film.", " Its director was Ann Lee."]],
                ["Beta", ["Beta is a 1950 film.", " Its director was Bo Kim."]],
                ["Ann Lee", ["Ann Lee was born in France."]],
                ["Bo Kim", ["Bo Kim was born in Korea."]],
            ],
            "supporting_facts": [["Alpha", 1], ["Beta", 1], ["Ann Lee", 0], ["Bo Kim", 0]],
            "evidences": [],
        },
        {
            "_id": "2w4",
            "type": "inference",
            "question": "Who is the paternal grandfather of Cy Dun?",
            "answer": "Ed Dun",
            "context": [
                ["Cy Dun", ["Cy Dun is a singer.", " His father is Di Dun."]],
                ["Di Dun", ["Di Dun is a painter.", " His father is Ed Dun."]],
            ],
            "supporting_facts": [["Cy Dun", 1], ["Di Dun", 1]],
            "evidences": [["Cy Dun", "father", "Di Dun"], ["Di Dun", "father", "Ed Dun"]],
        },
    ]


def musique_records() -> list[dict[str, Any]]:
    def paragraphs(*items: tuple[str, str, bool]) -> list[dict[str, Any]]:
        return [
            {"idx": k, "title": title, "paragraph_text": text, "is_supporting": supporting}
            for k, (title, text, supporting) in enumerate(items)
        ]

    return [
        {
            "id": "2hop__11_22",
            "question": "Who founded the company that makes the Zeta phone?",
            "answer": "Ola Berg",
            "answer_aliases": ["Berg", "O. Berg"],
            "answerable": True,
            "paragraphs": paragraphs(
                ("Noma", "Noma is a river in the north of the land of Velo.", False),
                ("Zeta phone", "The Zeta phone is made by Krell.", True),
                ("Krell", "Krell was founded by Ola Berg in 1990.", True),
            ),
            "question_decomposition": [
                {"id": 11, "question": "Zeta phone >> manufacturer", "answer": "Krell", "paragraph_support_idx": 1},
                {"id": 22, "question": "who founded #1", "answer": "Ola Berg", "paragraph_support_idx": 2},
            ],
        },
        {
            "id": "3hop1__33_44_55",
            "question": "In what year was the river's city founded?",
            "answer": "1201",
            "answer_aliases": [],
            "answerable": True,
            "paragraphs": paragraphs(
                ("Tovo", "The Tovo flows through Rask.", True),
                ("Rask", "Rask lies in Mida.", True),
                ("Mida", "Mida was founded in 1201.", True),
                ("Pell", "Pell is a small town.", False),
            ),
            "question_decomposition": [],
        },
        {
            "id": "2hop__66_77",
            "question": "Who painted the ceiling of the Hall of Oro?",
            "answer": "Ivo Lind",
            "answer_aliases": [],
            "answerable": False,
            "paragraphs": paragraphs(
                ("Hall of Oro", "The Hall of Oro is in Senn.", False),
                ("Senn", "Senn is a city.", False),
            ),
            "question_decomposition": [],
        },
    ]


QUALITY_ARTICLE = (
    "The ship landed on the red planet at dawn. Captain Vera stepped out first.\n\n"
    "She found a small metal box buried in the sand. Inside was a map of the old city.\n"
    "The crew followed the map for three days. At the end they found a library."
)


def quality_records() -> list[dict[str, Any]]:
    """One article in QuALITY's own layout and one in L-Eval's: each is one line of the file."""
    return [
        {
            "article_id": "51201",
            "set_unique_id": "51201_X",
            "batch_num": "22",
            "writer_id": "1009",
            "source": "Gutenberg",
            "title": "The Red Planet",
            "year": 1955,
            "author": "Anon",
            "topic": "",
            "url": "",
            "license": "",
            "article": QUALITY_ARTICLE,
            "questions": [
                {
                    "question": "What did Vera find in the sand?",
                    "question_unique_id": "51201_X_1",
                    "options": ["A map", "A metal box", "A library", "A ship"],
                    "gold_label": 2,
                    "writer_label": 2,
                    "validation": [],
                    "speed_validation": [],
                    "difficult": 0,
                },
                {
                    "question": "How long did the crew follow the map?",
                    "question_unique_id": "51201_X_2",
                    "options": ["One day", "Two days", "Three days", "A week"],
                    "gold_label": 3,
                    "writer_label": 3,
                    "validation": [],
                    "speed_validation": [],
                    "difficult": 1,
                },
            ],
        },
        {
            "input": "Tom planted a tree in spring. By summer it was tall.\nIn autumn its leaves turned gold.",
            "instructions": [
                "When did Tom plant the tree?\n\n (A) In winter \n (B) In spring \n (C) In summer \n (D) In autumn ",
                "What colour did the leaves turn?\n(A) Red\n(B) Brown\n(C) Gold\n(D) Both (A) and (B)",
            ],
            "outputs": ["(B) In spring", "(C) Gold"],
            "source": "quality",
            "evaluation": "exam",
        },
    ]


def filler_text(sentences: int = 400) -> str:
    """A plain-text filler: numbered sentences of a few words, several to a line."""
    colours = ("red", "green", "blue", "grey", "white")
    lines = []
    for k in range(0, sentences, 5):
        lines.append(" ".join(f"Line {k + j} speaks of a {colours[(k + j) % 5]} stone." for j in range(5)))
    return "\n".join(lines) + "\n"


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_fixture(name: str, folder: Path) -> Path | None:
    """Write ``name``'s fixture into ``folder``; None for the synthetic env, which reads no file."""
    data = {
        "hotpotqa": hotpotqa_records,
        "squad": squad_records,
        "locomo": locomo_records,
        "longmemeval": longmemeval_records,
        "ruler_hotpotqa": ruler_hotpotqa_records,
        "2wikimultihopqa": twowiki_records,
    }
    if name == "synthetic":
        return None
    if name == "needle":
        path = folder / "filler.txt"
        path.write_text(filler_text(), encoding="utf-8")
        return path
    if name in ("musique", "quality"):
        return write_jsonl(folder / f"{name}.jsonl", {"musique": musique_records, "quality": quality_records}[name]())
    return write_json(folder / f"{name}.json", data[name]())


# knobs that make the seed matter for every env (beyond task order) while keeping the fixtures small
CHECK_KNOBS = {
    "synthetic": {"context_tokens": 120, "num_tasks": 6},
    "hotpotqa": {"docs": 5},
    "squad": {"docs": 3},
    "locomo": {},
    "longmemeval": {"context_tokens": 1000},
    "ruler_hotpotqa": {"docs": 5},
    "needle": {"context_tokens": 200, "num_tasks": 6},
    "musique": {"answerable_only": False},
    "2wikimultihopqa": {},
    "quality": {},
}


def make(name: str, folder: Path, seed: int = 0, chunk_tokens: int = 16, **knobs):
    """Environment ``name`` over its fixture file written in ``folder``, with ``CHECK_KNOBS`` and ``knobs``."""
    return load_env(
        name,
        data_path=write_fixture(name, folder),
        count_tokens=words,
        chunk_tokens=chunk_tokens,
        seed=seed,
        **{**CHECK_KNOBS[name], **knobs},
    )
