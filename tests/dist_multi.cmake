# Several machines: the tcp backend (and mpi when CMake finds MPI).
# test_dist_tcp (failures: a rank killed mid-all_reduce, a hung rank, a wrong
# secret) and test_dist_auth (the secret's challenge-response) are registered
# by the test_*.c glob; here the collectives suite runs
# over tcp, as a real two-"machine" job on loopback, and under mpirun.
if(TARGET accel_cli)
  foreach(n 2 3 4)
    add_test(NAME dist_tcp_collectives_${n}
             COMMAND $<TARGET_FILE:accel_cli> launch --num_processes ${n} $<TARGET_FILE:test_dist_collectives>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(dist_tcp_collectives_${n} PROPERTIES TIMEOUT 120
                         ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_DIST_BACKEND=tcp")
  endforeach()
  # debug mode sits above the backend: the mismatch report works over tcp too
  add_test(NAME dist_tcp_debug_mismatch_2
           COMMAND $<TARGET_FILE:accel_cli> launch --debug --num_processes 2 $<TARGET_FILE:test_dist_faults> mismatch
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_tcp_debug_mismatch_2 PROPERTIES TIMEOUT 60
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=30;ACCEL_DIST_BACKEND=tcp")
  # a subgroup compares call sites as its parent does: the same all_reduce
  # from two lines on a split group fails on both ranks naming them
  add_test(NAME dist_split_sites_2
           COMMAND $<TARGET_FILE:accel_cli> launch --num_processes 2 $<TARGET_FILE:test_dist_faults> split_sites
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_split_sites_2 PROPERTIES TIMEOUT 60
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=30")
  # two launchers, --machine_rank 0 and 1, 2 workers each: tcp chosen by itself
  add_test(NAME dist_two_machines
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_two_machines.sh $<TARGET_FILE:accel_cli>
                   $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_two_machines PROPERTIES TIMEOUT 120 ENVIRONMENT "ACCEL_DIST_TIMEOUT=60")
  # the same with a different secret on each machine: machine 0 must report
  # the refused attempt at once (the timeout, 300 s, is far above ctest's)
  add_test(NAME dist_two_machines_wrong_secret
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_two_machines_wrong_secret.sh $<TARGET_FILE:accel_cli>
                   $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_two_machines_wrong_secret PROPERTIES TIMEOUT 60 ENVIRONMENT "ACCEL_DIST_TIMEOUT=300")
  # machine 1's rank 2 refuses its environment before the rendezvous: machine
  # 0 must name it and its message at once (the timeout, 300 s, is far above ctest's)
  add_test(NAME dist_two_machines_failed_early
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_two_machines_failed_early.sh $<TARGET_FILE:accel_cli>
                   $<TARGET_FILE:test_dist_faults> accelerator
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_two_machines_failed_early PROPERTIES TIMEOUT 60 ENVIRONMENT "ACCEL_DIST_TIMEOUT=300")
  # the interleaving that once hung it under load: machine 1's rank 2 never
  # reaches the store (killed by its launcher once rank 3 was refused), so
  # machine 0's wait is stuck on rank 2 and must fail on rank 3's refusal
  add_test(NAME dist_two_machines_wrong_secret_stalled
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_two_machines_wrong_secret.sh $<TARGET_FILE:accel_cli>
                   --stall 2 $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_two_machines_wrong_secret_stalled PROPERTIES TIMEOUT 60
                       ENVIRONMENT "ACCEL_DIST_TIMEOUT=300")
  # the same job hierarchically (shm inside each machine: checked by a counter)
  # and on the flat tcp ring: the same results, bit for bit
  add_test(NAME dist_two_machines_hier_vs_flat
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_hier_compare.sh $<TARGET_FILE:accel_cli>
                   $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_two_machines_hier_vs_flat PROPERTIES TIMEOUT 180 ENVIRONMENT "ACCEL_DIST_TIMEOUT=60")
  # two SLURM "nodes" in two network namespaces (root + iproute2, else skipped):
  # srun without accel launch, and srun accel launch
  add_test(NAME dist_netns_slurm
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_netns_slurm.sh $<TARGET_FILE:accel_cli>
                   $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_netns_slurm PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
if(MPI_C_FOUND AND MPIEXEC_EXECUTABLE)
  # _nosan: OpenMPI's own allocations (never freed by MPI_Finalize) trip
  # LeakSanitizer in every process, whatever accel does; the accel code these
  # runs exercise (dist.c above the backend) runs under ASan in the tests above.
  add_test(NAME dist_mpi_collectives_2_nosan
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_mpi_collectives_2_nosan PROPERTIES TIMEOUT 120
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_DIST_BACKEND=mpi")
  # point to point (MPI_Isend/Irecv under the group timeout) on 2 and 4 ranks
  foreach(n 2 4)
    add_test(NAME dist_mpi_p2p_${n}_nosan
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${n} $<TARGET_FILE:test_dist_p2p>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(dist_mpi_p2p_${n}_nosan PROPERTIES TIMEOUT 120
                         ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_DIST_BACKEND=mpi")
  endforeach()
  add_test(NAME dist_mpi_debug_mismatch_2_nosan
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:test_dist_faults> mismatch
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_mpi_debug_mismatch_2_nosan PROPERTIES TIMEOUT 60
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=30;ACCEL_DEBUG_MODE=1")
  # subgroups (MPI_Comm_split) of unequal sizes, and of one
  add_test(NAME dist_mpi_collectives_3_nosan
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_mpi_collectives_3_nosan PROPERTIES TIMEOUT 120
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_DIST_BACKEND=mpi")
  # without debug mode: a barrier against an all_reduce fails both ranks at once
  add_test(NAME dist_mpi_diverge_2_nosan
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:test_dist_faults> diverge
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_mpi_diverge_2_nosan PROPERTIES TIMEOUT 60
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=20;ACCEL_DIST_BACKEND=mpi")
  # the same all_reduce from two lines: both ranks name the different call sites
  add_test(NAME dist_mpi_sites_2_nosan
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:test_dist_faults> sites
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_mpi_sites_2_nosan PROPERTIES TIMEOUT 60
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=20;ACCEL_DIST_BACKEND=mpi")
  # MPI's MAX drops a NaN: clipping's partial norms keep it (accel__norm_all_reduce)
  add_test(NAME norm_all_reduce_mpi_2_nosan
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:test_norm_all_reduce>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(norm_all_reduce_mpi_2_nosan PROPERTIES TIMEOUT 60
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=30;ACCEL_DIST_BACKEND=mpi")
  # HYBRID_SHARD under mpirun: 4 ranks as 2 "machines" of 2 (run_mpi_machines.sh)
  add_test(NAME accelerator_zero3_hybrid_mpi_2x2_nosan
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 4
                   bash ${CMAKE_CURRENT_SOURCE_DIR}/run_mpi_machines.sh 2 $<TARGET_FILE:test_accelerator_zero3>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(accelerator_zero3_hybrid_mpi_2x2_nosan PROPERTIES TIMEOUT 240
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_DIST_BACKEND=mpi;ACCEL_FSDP_SHARDING_STRATEGY=HYBRID_SHARD;ACCELERATE_USE_FSDP=true"
    PASS_REGULAR_EXPRESSION "zero3 world=4 mp=no accum=1 clip=0 wrap=0 fwd_prefetch=0 bwd_prefetch=1 reshard=1 persist=0 ckpt=0 shard_world=2\n"
    FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
endif()
