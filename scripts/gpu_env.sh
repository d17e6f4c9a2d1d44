# Sourced by the GPU scripts (gpu_check.sh, gpu_learning.sh) from the repository root: picks the python ($py) and
# puts the project's dependencies the GPU image lacks on PYTHONPATH. The GPU image's python (torch, transformers,
# peft, typer, rich, pyarrow, numpy) is kept: the wheels go to a separate folder, installed with pip --no-index
# from .gpu_wheels/ only (scripts/gpu_wheels.sh makes them where pip works). Without a GPU, .venv's python.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false AGENTMEM_DB=
py=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && ! command -v nvidia-smi >/dev/null; then py=.venv/bin/python; fi
site=${AGENTMEM_GPU_SITE:-/tmp/agentmem-site}
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import sqlalchemy, pydantic, alembic" 2>/dev/null; then
  [ -d .gpu_wheels ] || { echo "missing dependencies and no .gpu_wheels/: run scripts/gpu_wheels.sh where pip works"; exit 1; }
  names=$(ls .gpu_wheels/*.whl | xargs -n1 basename | cut -d- -f1 | sort -u)
  # shellcheck disable=SC2086  # one argument per name
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --find-links .gpu_wheels --target "$site" \
    $names || exit 1
fi
