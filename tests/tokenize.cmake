# `trainrun tokenize` (issue 22): token files equal HF tokenizers' ids + EOS for the fixture
# tokenizers (uint16 and uint32), the sidecar is right, and the text dataset (format = "auto")
# trains on the result.
add_test(NAME tokenize.corpus
  COMMAND ${TRAINRUN_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/tokenize_ref.py $<TARGET_FILE:trainrun>
          ${CMAKE_SOURCE_DIR}/../shared/fixtures/tokenizers ${CMAKE_CURRENT_BINARY_DIR}/work/tokenize-corpus)
set_tests_properties(tokenize.corpus PROPERTIES TIMEOUT 300 LABELS "text"
  ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
