# The feeding service end to end (datasets, jobs, epochs, index and batch streams, restart,
# SIGKILL, resize) and the PyTorch samplers in a 4-process torch.distributed (gloo) run.
add_test(NAME feed_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_feed
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(feed_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

# Sampling II in the daemon (issue 17): weighted batch shares, resizes that chain.
add_test(NAME feed_resize_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_feed_resize
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(feed_resize_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

add_test(NAME feed_torch_ddp
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_ddp
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(feed_torch_ddp PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 600)

# torchrun --standalone rendezvous on the fixed port 29400: the tests that use it never run at the
# same time (RESOURCE_LOCK), or one fails with "Address already in use". They also run alone
# (RUN_SERIAL): torchrun picks its workers' store port by binding port 0 and releasing it, and a
# test running beside it may take that port first (seen: EADDRINUSE on the store's port). torch
# 2.x's torchrun keeps its ports, but the groups keep both cores busy: run beside other tests,
# each took about 1.7x as long and the stage gained nothing (2026-11-28).
# Real training with the drop-in under torchrun (3 DDP ranks, gloo, CPU): ranks SIGKILLed mid-epoch,
# sluiced killed or stopped while they train, a batch job, empty shares, job mismatches; ~3 min,
# alone. Release build only (no_asan): what it asks of the daemon (streams, reports, restarts,
# stops) runs sanitized in feed_torch_ddp, feed_integration, faults_* and ckpt_torch_train, and
# sanitized it added 3.4 serial minutes to CI.
add_test(NAME feed_torch_train
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_train
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(feed_torch_train PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 900
                     LABELS "python;feed;no_asan"
                     RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)

# The PyTorch drop-in against torch's DataLoader + DistributedSampler (tests/bench/
# torch_loader_bench.py); ctest runs a small smoke round only.
add_test(NAME torch_loader_bench_smoke
         COMMAND ${SL_PYTHON} "${CMAKE_CURRENT_SOURCE_DIR}/bench/torch_loader_bench.py" --smoke)
set_tests_properties(torch_loader_bench_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS bench)

# The benchmark (tests/bench/feed_bench.c, feed_bench.py); ctest runs a small smoke round only.
add_executable(feed_bench bench/feed_bench.c)
target_link_libraries(feed_bench PRIVATE sluice_static Threads::Threads m)
add_test(NAME feed_bench_smoke COMMAND feed_bench --smoke)
set_tests_properties(feed_bench_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS bench)
add_test(NAME feed_bench_py_smoke
         COMMAND ${SL_PYTHON} "${CMAKE_CURRENT_SOURCE_DIR}/bench/feed_bench.py" --smoke --no-torch)
set_tests_properties(feed_bench_py_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS bench)

# Catalog queries of the feeding service.
add_executable(feed_catalog_test unit/feed_catalog_test.c)
target_link_libraries(feed_catalog_test PRIVATE sl_catalog sl_common)
add_test(NAME feed_catalog_unit COMMAND feed_catalog_test)
set_tests_properties(feed_catalog_unit PROPERTIES TIMEOUT 60)

# The feeding service's job state (server/feed/state.c), linked from sl_server_core.
add_executable(feed_state_test unit/feed_state_test.c)
target_link_libraries(feed_state_test PRIVATE sl_server_core)
add_test(NAME feed_state_unit COMMAND feed_state_test)
set_tests_properties(feed_state_unit PROPERTIES TIMEOUT 60)
# server/feed/labels.c and catalog migration 6 (dataset labels).
add_executable(feed_labels_test unit/feed_labels_test.c)
target_link_libraries(feed_labels_test PRIVATE sl_server_core)
add_test(NAME feed_labels_unit COMMAND feed_labels_test)
set_tests_properties(feed_labels_unit PROPERTIES TIMEOUT 60)

# Sampling II through the daemon (issue 17): labels, stratified / class-balanced / weighted jobs,
# a restart mid-epoch and the comparison with scikit-learn's StratifiedKFold.
add_test(NAME sampling2_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_sampling2
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(sampling2_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

# Batch jobs with classes (issue 17): stratified / class-balanced batch plans, mid-epoch
# resizes, a restart mid-epoch.
add_test(NAME class_batches_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_class_batches
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(class_batches_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)

# Stratified shares under torchrun (3 DDP ranks, gloo, CPU) on an imbalanced dataset; ~10 s.
add_test(NAME sampling2_torchrun
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_strat
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(sampling2_torchrun PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "python;feed"
                     RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)

# sluice.torch.DataLoader(num_workers=2) from `python -` and `python -c` (no script file).
add_test(NAME feed_torch_workers
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_workers
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(feed_torch_workers PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "python;feed")

# The data position as a torch Stateful (sampler/DataLoader state_dict and load_state_dict,
# Epochs.Rewind): resume, into another world, torch.load(weights_only), torchdata's
# StatefulDataLoader, a torch.distributed.checkpoint state dict, and torchrun: 2 ranks with
# sluice.torch.DataLoader and with StatefulDataLoader (2 workers), a rank SIGKILLed between two
# DCP saves, the group restarted from the newest: the uninterrupted run's batches and model bit
# for bit; 3 ranks stopped and restarted as 2. About 2 min. feed_torch_state_pg: the kill and
# restart over three replicas of one PostgreSQL catalog.
add_test(NAME feed_torch_state
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_state
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(feed_torch_state PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 480
                     LABELS "python;feed;torchrun"
                     RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)
add_test(NAME feed_torch_state_pg
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_state.TorchrunTest.test_kill_and_restart_from_dcp
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(feed_torch_state_pg PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SL_TEST_CATALOG=postgresql;SL_TEST_REPLICAS=3"
                     TIMEOUT 300 LABELS "python;feed;torchrun;no_asan;pg"
                     RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)
