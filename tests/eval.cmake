# `trainrun eval` against EleutherAI's lm-evaluation-harness (lm_eval 0.4.13 in the reference venv,
# its "hf" model; tests/e2e/eval_lm_eval.py). eval.lm_eval: a tiny Llama trained briefly on the
# GPL 3 (built once into its work dir) and five YAML tasks in lm-eval's format over local JSONL
# files (zero-shot, few-shot from a train split and from the test split itself, rolling
# perplexity with several windows, generation with two filters) run by lm_eval.simple_evaluate and
# by trainrun eval: every request's context and continuation, loglikelihood (1e-4 relative),
# greedy flag, generated and filtered string, per-document metric, and results.json's aggregates,
# n-shot and versions must agree. eval.errors: an unknown output_type or metric, a template field
# the data lacks and a missing --tasks path exit 2 naming the culprit. eval.ranks: the same tasks
# as a training job's [eval] table at world 2 under ddp and fsdp, before and after a step at lr 0,
# against the same lm-eval outputs. lm_eval missing fails the
# test (scripts/venv installs it), it does not skip it.
foreach(_case lm_eval errors ranks)
  if(_case STREQUAL "lm_eval")
    set(_arg main)
  else()
    set(_arg ${_case})
  endif()
  add_test(NAME eval.${_case}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/eval_lm_eval.py $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_BINARY_DIR}/work/eval-${_case} --case ${_arg})
  set_tests_properties(eval.${_case} PROPERTIES TIMEOUT 600 LABELS "eval"
    ENVIRONMENT "HF_HUB_OFFLINE=1;HF_DATASETS_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false;OMP_NUM_THREADS=2;OPENBLAS_NUM_THREADS=2")
endforeach()

# The same agreement on a real model and the shipped tasks (eval/tasks/: WordNet and the GPL 3):
# SmolLM2-135M-Instruct, every document, lm-eval beside trainrun (bench/eval_lm_eval.py --check,
# which also prints the throughput ratio). Long suite: ~10 minutes on 2 cores.
add_test(NAME eval.smollm2
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_SOURCE_DIR}/bench/eval_lm_eval.py --check
          --trainrun $<TARGET_FILE:trainrun> --model ${CMAKE_BINARY_DIR}/cache/smollm2-135m-instruct
          --work ${CMAKE_CURRENT_BINARY_DIR}/work/eval-smollm2)
set_tests_properties(eval.smollm2 PROPERTIES TIMEOUT 1800 LABELS "eval;long"
  ENVIRONMENT "HF_HUB_OFFLINE=1;HF_DATASETS_OFFLINE=1;TRANSFORMERS_OFFLINE=1;TOKENIZERS_PARALLELISM=false")
