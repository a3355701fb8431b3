#!/usr/bin/env bash
# Mutation testing of the modules where a silent bug costs a training run, each against its fast
# tests (scripts/mutation.py plants one mutant at a time in a scratch copy and lists the
# survivors; tests/MUTATION.md says why the remaining ones are equivalent). One module at a time,
# at the lowest priority. Outcomes go to .mutation/NAME.jsonl and .mutation/NAME.log.
#   bash scripts/mutation.sh                     # every module below (~1.5 h on a 2-core machine)
#   bash scripts/mutation.sh sampling dedupe     # some of them
# MUTATION_PYTHON=/path/to/python uses that interpreter instead of the project's .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${MUTATION_PYTHON:-}" ]; then
  . "$ROOT/scripts/env.sh"
  MUTATION_PYTHON=python
fi
cd "$ROOT"

mutate() {  # NAME TARGET PYTEST_ARGS...
  local name="$1" target="$2"
  shift 2
  nice -n 19 "$MUTATION_PYTHON" scripts/mutation.py "$target" --json ".mutation/$name.jsonl" -- "$@" | tee ".mutation/$name.log"
}

run_module() {
  case "$1" in
    sampling) mutate sampling fastload/orders/global_order.py tests/orders/test_orders.py tests/loading/test_fast_path.py \
                -k "test_sampling or sample_streams or flip or train_crop or every_sample or state_dict or streaming or same_seed or epochs_differ" ;;
    orderspec) mutate orderspec fastload/orders/spec.py tests/orders/test_orders.py tests/orders/test_permutation.py ;;
    permutation) mutate permutation fastload/orders/permutation.py tests/orders/test_permutation.py ;;
    transforms) mutate transforms fastload/transforms.py tests/test_transform_plans.py tests/loading/test_fast_path.py tests/test_fields.py \
                -k "plans or train_crop or offsets or flip or follows or val_preset or center_crop or crop_decoder or normalize or to_dtype or transform_spec or varying or mask_stays or boxes_enclose" ;;
    index) mutate index fastload/formats/index.py tests/formats/test_index_bounds.py tests/test_untrusted_index.py tests/formats/test_shard_columns.py ;;
    idx) mutate idx fastload/formats/idx.py tests/formats/test_index_bounds.py tests/formats/test_shard_columns.py tests/test_untrusted_index.py \
                -k "idx or bounds or key or field_names or members or damaged or compact" ;;
    files) mutate files fastload/_util/files.py tests/formats/test_index_bounds.py tests/test_untrusted_index.py ;;
    cache) mutate cache fastload/storage/cache.py tests/storage/test_cache.py tests/test_untrusted_index.py tests/storage/test_remote.py \
                -k "cache or digest or http_dataset or corrupted" ;;
    verify) mutate verify fastload/storage/verify.py tests/storage/test_verify.py tests/test_untrusted_index.py -k "verify or climbing" ;;
    plan) mutate plan fastload/converters/plan.py tests/converters/test_sources.py ;;
    dedupe) mutate dedupe fastload/converters/dedupe.py:find_duplicates tests/converters/test_sources.py -k dedupe ;;
    dedupe-hash) mutate dedupe-hash fastload/converters/dedupe.py:hash_items tests/converters/test_sources.py -k dedupe ;;
    *) echo "unknown module '$1' (sampling orderspec permutation transforms index idx files cache verify plan dedupe dedupe-hash)" >&2; return 2 ;;
  esac
}

mkdir -p .mutation
modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=(sampling transforms index idx files cache verify plan dedupe dedupe-hash)
for name in "${modules[@]}"; do
  rm -f ".mutation/$name.jsonl"
  run_module "$name"
done
