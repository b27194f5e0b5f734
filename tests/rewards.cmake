# Reward plugins (issue 44, ABI 1.10) through `trainrun reward` and `trainrun check`
# (tests/e2e/rewards_check.py): accuracy, format, length and their weighted sum against Python's
# re and TRL 1.16's reward functions, the bad [[rewards]] tables; the command reward with a judge
# program that behaves, then one for each way of misbehaving (exits, hangs, non-number, too many
# or too few lines), each exit 2 naming the reward and the row.
if(NOT TARGET rewards)
  return()
endif()
set(_rc ${CMAKE_CURRENT_SOURCE_DIR}/e2e/rewards_check.py)
set(_rc_work ${CMAKE_CURRENT_BINARY_DIR}/work/rewards_check)
add_test(NAME rewards.plugins
  COMMAND ${TRAINRUN_REF_PYTHON} ${_rc} $<TARGET_FILE:trainrun> ${_rc_work}/plugins --part plugins)
add_test(NAME rewards.command
  COMMAND ${TRAINRUN_REF_PYTHON} ${_rc} $<TARGET_FILE:trainrun> ${_rc_work}/command --part command)
set_tests_properties(rewards.plugins rewards.command PROPERTIES TIMEOUT 300 LABELS rewards)
