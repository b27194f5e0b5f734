# Several hosts on one machine (network namespaces with their own addresses, joined by a bridge;
# tests/e2e/netns_lib.sh): trainrun's multi-node launch across them, equivalence with one process,
# and faults of a host or its link. Needs root; skipped (77) with the reason printed otherwise.
set(_cluster_cases ddp collectives ddp3 fsdp_hybrid mpi mpijob pytorchjob link_cut host_killed host_missing master_dies slow_link elastic_rejoin elastic_worker)
foreach(case ${_cluster_cases})
  add_test(NAME cluster_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/cluster_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence ${CMAKE_CURRENT_BINARY_DIR}/work/cluster-${case} ${case})
  # Two runs (one process, then 4-6 ranks on two cores).
  set_tests_properties(cluster_e2e.${case} PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77 LABELS cluster)
endforeach()

# A real SLURM (slurm-wlm + munge) started for each test alone (tests/e2e/slurm_lib.sh): srun, the
# shipped sbatch script, scancel. Skipped (77) with the reason where the packages are missing.
foreach(case srun sbatch scancel requeue killed_task)
  add_test(NAME slurm_e2e.${case}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e/slurm_e2e.sh $<TARGET_FILE:trainrun>
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/equivalence ${CMAKE_CURRENT_BINARY_DIR}/work/slurm-${case}
            ${CMAKE_SOURCE_DIR} ${case})
  # One at a time: each test's throwaway SLURM numbers its jobs from 1, and under plain srun
  # rank 0 serves the store on a port derived from the job and step ids (as on a real cluster,
  # where job ids are unique), so two of these at once would pick the same port.
  # RUN_SERIAL: the throwaway slurmctld/slurmd are slow to act under a loaded machine (scancel
  # to the ranks' end took 46 s beside two busy processes, 0.8 s alone), which measures SLURM's
  # daemons, not trainrun.
  set_tests_properties(slurm_e2e.${case} PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77 LABELS cluster
    RESOURCE_LOCK slurm_job_ids RUN_SERIAL TRUE)
endforeach()
