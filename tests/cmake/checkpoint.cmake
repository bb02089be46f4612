# Checkpoint shards: the shard format unit test and the daemon's Checkpoints service end to end.
if (TARGET sl_shard)
  add_executable(shard_test unit/shard_test.c)
  target_link_libraries(shard_test PRIVATE sl_shard sl_common)
  add_test(NAME shard_unit COMMAND shard_test)
  set_tests_properties(shard_unit PROPERTIES TIMEOUT 60)
endif ()

# The daemon's side, linked from sl_server_core: the store (server/store/), the checkpoint queries
# of the catalog (server/catalog/ckpt.c) and the service's request validation (server/ckpt/).
foreach (unit store ckpt_catalog ckpt_validate)
  add_executable(${unit}_test unit/${unit}_test.c)
  target_link_libraries(${unit}_test PRIVATE sl_server_core)
  add_test(NAME ${unit}_unit COMMAND ${unit}_test)
  set_tests_properties(${unit}_unit PROPERTIES TIMEOUT 60 LABELS checkpoint)
endforeach ()

add_test(NAME checkpoint_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_checkpoints
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(checkpoint_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300)
# The same tests with the shards in object storage (one s3rver per test process,
# tests/python/sltest.py with SL_TEST_STORE=s3); ~35 s.
add_test(NAME checkpoint_integration_s3
         COMMAND ${SL_PYTHON} -m unittest -v test_checkpoints
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(checkpoint_integration_s3 PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SL_TEST_STORE=s3" TIMEOUT 300
                     LABELS "checkpoint;s3")

# Downloads from an offset and of a range, checked block by block (issue 25), with the directory
# store and with object storage; ~10 s each.
add_test(NAME ckpt_ranges_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_ckpt_ranges
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(ckpt_ranges_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS checkpoint)
add_test(NAME ckpt_ranges_integration_s3
         COMMAND ${SL_PYTHON} -m unittest -v test_ckpt_ranges
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(ckpt_ranges_integration_s3 PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SL_TEST_STORE=s3" TIMEOUT 120
                     LABELS "checkpoint;s3")

# The benchmark (tests/bench/ckpt_bench.c); ctest runs a small smoke round only.
add_executable(ckpt_bench bench/ckpt_bench.c)
target_link_libraries(ckpt_bench PRIVATE sluice_static Threads::Threads)
add_test(NAME ckpt_bench_smoke COMMAND ckpt_bench --smoke)
set_tests_properties(ckpt_bench_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS bench)

# Checkpoints that carry the data position (issue 14): feed state with COMPLETE, Restore.
add_test(NAME ckpt_position_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_ckpt_position
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(ckpt_position_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120)

# The Python side of issue 14 (tests/python/): data positions of the samplers and DataLoader,
# the Checkpoints client's feed fields and Restore, and sluice.torch.CheckpointManager (round
# trips that rewind the feed, keep_last, a background upload failing with the daemon); ~1 min.
add_test(NAME ckpt_torch
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_ckpt
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(ckpt_torch PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "python;checkpoint")

# The caps on a state skeleton that load_state_dict reads (issue 25): tensor count, JSON size
# and values, shapes with a zero next to a huge dimension; no daemon, ~10 s.
add_test(NAME torch_ckpt_state
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_ckpt_state
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(torch_ckpt_state PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "python;checkpoint")

# The exactness test with real torchrun (3 DDP ranks, gloo, CPU): a rank or sluiced killed
# between asynchronous checkpoints, the group restored, parameters bit-identical to an
# uninterrupted run's; a restart into another world size; ~5 min alone. Release build only
# (no_asan), as feed_torch_train: its time is torch's, and what it asks of the daemon (uploads
# resumed after a kill, auto-commits, Restore) runs sanitized in ckpt_torch, ckpt_torch_pg,
# checkpoint_integration and the faults tests.
add_test(NAME ckpt_torch_train
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_ckpt_train
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(ckpt_torch_train PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 900
                     LABELS "python;checkpoint;no_asan"
                     RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)

# torch.distributed.checkpoint into sluiced (sluice.torch.dcp, tests/python/test_torch_dcp.py):
# FSDP2 on 4 torchrun ranks saved with dcp.save and async_save (thread, process), loaded into 4,
# 3, 2 ranks and one process bit-identical, a rank killed in async_save; ~3 min, alone, release
# build only (the daemon's side of it, ranges and commits, runs sanitized in ckpt_dcp_input and
# the ckpt_ranges tests). ckpt_dcp_input: damaged shards, tampered metadata, ranges out of bounds
# or of a WRITING checkpoint, a COMPLETE step saved again; a few seconds.
add_test(NAME ckpt_dcp
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_dcp.DcpTorchrunTest
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(ckpt_dcp PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 900
                     LABELS "python;checkpoint;torchrun;no_asan"
                     RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)
add_test(NAME ckpt_dcp_input
         COMMAND ${SL_PYTHON} -m unittest -v test_torch_dcp.DcpBadInputTest
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
set_tests_properties(ckpt_dcp_input PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "python;checkpoint")
# The same on object storage and over three replicas of one PostgreSQL catalog: one save run
# (dcp.save, async_save with the thread checkpointer) loaded into 2 ranks, and the bad input.
foreach (variant "s3|SL_TEST_STORE=s3|s3" "pg|SL_TEST_CATALOG=postgresql;SL_TEST_REPLICAS=3|pg")
  string(REPLACE "|" ";" parts "${variant}")
  list(GET parts 0 sfx)
  list(GET parts -1 label)
  list(REMOVE_AT parts 0 -1)
  add_test(NAME ckpt_dcp_${sfx}
           COMMAND ${SL_PYTHON} -m unittest -v test_torch_dcp.DcpTorchrunTest.test_load_into_two_ranks
                   test_torch_dcp.DcpBadInputTest
           WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python")
  set_tests_properties(ckpt_dcp_${sfx} PROPERTIES
                       ENVIRONMENT "${SL_TEST_ENV};${parts};SL_DCP_SAVES=2:sync,3:thread,4:manager"
                       TIMEOUT 600 LABELS "python;checkpoint;torchrun;no_asan;${label}"
                       RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)
endforeach ()

# DCP's save, async_save and load into sluiced against its FileSystemWriter/Reader
# (tests/bench/dcp_bench.py); ctest runs a small smoke round only.
add_test(NAME dcp_bench_smoke
         COMMAND ${SL_PYTHON} "${CMAKE_CURRENT_SOURCE_DIR}/bench/dcp_bench.py" --smoke)
set_tests_properties(dcp_bench_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS bench)

# The training loop's stall of one save (tests/bench/ckpt_save_bench.py); ctest runs a small
# smoke round only.
add_test(NAME ckpt_save_bench_smoke
         COMMAND ${SL_PYTHON} "${CMAKE_CURRENT_SOURCE_DIR}/bench/ckpt_save_bench.py" --smoke)
set_tests_properties(ckpt_save_bench_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS bench)

# The S3 client (server/store/s3*.c) against s3rver (installed by tests/s3/install.sh) and a
# fault-injecting proxy; boto3 reads back what the client wrote.
add_executable(s3_test unit/s3_test.c)
target_link_libraries(s3_test PRIVATE sl_server_core)
add_test(NAME s3_unit COMMAND s3_test offline)
set_tests_properties(s3_unit PROPERTIES TIMEOUT 60 LABELS "checkpoint;s3")
add_test(NAME s3client_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_s3client
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(s3client_integration PROPERTIES
                     ENVIRONMENT "${SL_TEST_ENV};SL_S3_TEST=$<TARGET_FILE:s3_test>"
                     TIMEOUT 300 LABELS "checkpoint;s3")
# sluiced on object storage (issue 16): boto3 reads back what it wrote, deep verify names damaged
# objects, sluiced or s3rver killed mid-upload and mid-commit, 503s/resets/a dead store through
# FaultProxy, a part the store rejects (BadDigest) sent again, the sweep's abort of abandoned
# uploads and of multipart uploads no state names, bad configurations, the secret key kept out
# of logs, info and metrics; ~30 s.
add_test(NAME s3store_integration
         COMMAND ${SL_PYTHON} -m unittest -v test_s3store
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(s3store_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "checkpoint;s3")

# Checkpoints in object storage side by side (tests/bench/s3_bench.py): the local store, sluiced
# into s3rver, boto3 straight to s3rver, deep verify against download + sha256sum; ctest runs a
# small smoke round only (16 MiB, one run, two settings).
add_test(NAME s3_bench_smoke
         COMMAND ${SL_PYTHON} "${CMAKE_CURRENT_SOURCE_DIR}/bench/s3_bench.py" --smoke)
set_tests_properties(s3_bench_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 180
                     LABELS "bench;s3")
