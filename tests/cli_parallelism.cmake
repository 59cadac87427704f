# ParallelismConfig and Megatron-LM in the CLI (test_cli_parallelism.c): it
# execs the launcher and the fault worker (its Accelerator's verdict).
add_dependencies(test_cli_parallelism accel_cli test_dist_faults)
