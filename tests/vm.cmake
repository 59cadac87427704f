# The virtual memory's pool and rules (tests/test_vm_pool.c, on hostless:0)
# also with CUDA's 2 MiB granule and with unmaps that wait for their work.
add_test(NAME vm_pool_2mib COMMAND test_vm_pool)
set_tests_properties(vm_pool_2mib PROPERTIES TIMEOUT 120 ENVIRONMENT "ACCEL_TEST_VM_GRANULE=2097152")
add_test(NAME vm_pool_sync_unmap COMMAND test_vm_pool)
set_tests_properties(vm_pool_sync_unmap PROPERTIES TIMEOUT 120 ENVIRONMENT "ACCEL_VM_SYNC_UNMAP=1")
# ZeRO-3 on the device (DDP and ZeRO-1/2/3 equal to one cpu process) with
# CUDA's 2 MiB granule: every unit's range then spans whole 2 MiB granules.
if(TARGET accel_cli)
  add_test(NAME accelerator_device_hostless_2mib_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:test_accelerator_device>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(accelerator_device_hostless_2mib_2 PROPERTIES TIMEOUT 120
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0;ACCEL_TEST_VM_GRANULE=2097152")
endif()
