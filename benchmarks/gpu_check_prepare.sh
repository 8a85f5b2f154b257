#!/usr/bin/env bash
# Prepare what benchmarks/gpu_check.py needs on a lent GPU machine, from the repository root, on the CPU
# machine (about 4 minutes, most of it building SmolLM2 once):
#   .gpu/smollm2/  SmolLM2-135M-Instruct's config and tokenizer (3.4 MB; no weights travel)
#   .whl/          the wheels the GPU image lacks (pydantic, math-verify and theirs; 2.9 MB, Python 3.12)
# Both are ignored by git (.git/info/exclude) and travel as `carry: [".gpu", ".whl"]`. Then run there:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   for p in tasks verifiers sandbox; do ln -sfn ../$p rlvr/$p; done   # rlvr.tasks etc. as installed
#   PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --smollm2 .gpu/smollm2 --out $OUT/gpu_check.json
set -euo pipefail
cd "$(dirname "$0")/.."
for path in /.gpu/ /.whl/; do
    grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude
done
if [ ! -f .gpu/smollm2/tokenizer.json ]; then
    model=$(mktemp -d)/smollm2
    bash ../shared/tools/make_smollm2.sh "$model"
    mkdir -p .gpu/smollm2
    cp "$model"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .gpu/smollm2/
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    pydantic==2.13.4 pydantic_core==2.46.4 annotated-types typing-inspection math-verify latex2sympy2_extended \
    antlr4-python3-runtime==4.13.2
du -sh .gpu .whl
