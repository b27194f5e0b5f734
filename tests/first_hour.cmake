# A QLoRA user's first hour (issue 51, tests/e2e/first_hour.py): LoRA and quant targets checked
# by `trainrun check`, its output, an error every rank meets printed once, one base for a QLoRA
# adapter in merge-lora and generate, the memory estimate of a QLoRA job against the run, and the
# peak estimate (activations included) of LoRA in fp32 and bf16-mixed against the run.
foreach(case targets output errors qlora estimate peak)
  add_test(NAME first_hour.${case}
    COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/first_hour.py $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_BINARY_DIR}/work/first-hour-${case} ${case})
  set_tests_properties(first_hour.${case} PROPERTIES TIMEOUT 300 LABELS "llama;first_hour"
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
