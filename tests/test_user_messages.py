"""Messages in the user's words: an environment that needs --data says so by the flag and
says what file it wants (needle: any plain-text filler, not a JSON release); MuSiQue's reader takes its
records as one JSON array as well as JSON lines, and names a bad record by its index."""

from __future__ import annotations

import json

import pytest
from fixtures_envs import musique_records, words, write_jsonl

from envs import EnvError, load_env


def env_of(name, path, **knobs):
    return load_env(name, data_path=path, count_tokens=words, chunk_tokens=100, seed=0, **knobs)


def test_musique_reads_a_json_array_like_json_lines(tmp_path):
    lines = write_jsonl(tmp_path / "m.jsonl", musique_records())
    array = tmp_path / "m.json"
    array.write_text(json.dumps(musique_records(), indent=1))
    assert env_of("musique", array).tasks() == env_of("musique", lines).tasks()


def test_musique_array_errors_name_the_record(tmp_path):
    records = musique_records()
    del records[1]["paragraphs"]
    array = tmp_path / "m.json"
    array.write_text(json.dumps(records))
    with pytest.raises(EnvError, match=rf"m.json: record 1 \(id '{records[1]['id']}'\): missing field 'paragraphs'"):
        env_of("musique", array)


@pytest.mark.parametrize(("name", "wants"), [
    ("needle", "give --data FILE (any plain-text file: the filler the bAbI stories are hidden in)"),
    ("hotpotqa", "give --data FILE (HotpotQA's official JSON, e.g. hotpot_dev_distractor_v1.json)"),
    ("musique", "give --data FILE (MuSiQue's JSON lines (or one JSON array), e.g. musique_ans_v1.0_dev.jsonl)"),
])
def test_missing_data_names_the_flag_and_the_file_it_wants(name, wants):
    with pytest.raises(EnvError) as err:
        load_env(name, count_tokens=words, chunk_tokens=100, seed=0)
    assert str(err.value) == f"{name}: needs a data file: {wants}"
    assert "data_path" not in str(err.value) and ("JSON" not in str(err.value) or name != "needle")
