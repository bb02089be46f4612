# The feeding and checkpoint integration tests again with the catalog in PostgreSQL and three
# replicas (SL_TEST_CATALOG=postgresql SL_TEST_REPLICAS=3: tests/python/pgfixture.py starts a real
# PostgreSQL 15 per test process; each Daemon of a test is three sluiced on a database of its own
# and one data dir, its clients spread over them: sltest.Daemon.addr names the next replica each
# time, and the torchrun ranks start on different replicas of Daemon.addrs). The two long torchrun
# suites run so in the release build only (label no_asan): sanitized, they would double its
# longest tests; and only the cases where replicas differ from one daemon (a rank killed with its
# reports on another replica, a replica killed, a resize, a batch job): the rest of each suite
# exercises the catalog as the sanitized single-daemon runs do, at 5 min a suite. A module field
# may name several tests, joined by "+".
set(SL_PG_TESTS
    "feed_integration_pg|integration|test_feed|feed,pg"
    "feed_resize_integration_pg|integration|test_feed_resize|feed,pg"
    "sampling2_integration_pg|integration|test_sampling2|feed,pg"
    "class_batches_integration_pg|integration|test_class_batches|feed,pg"
    "checkpoint_integration_pg|integration|test_checkpoints|checkpoint,pg"
    "ckpt_position_integration_pg|integration|test_ckpt_position|checkpoint,pg"
    "ckpt_ranges_integration_pg|integration|test_ckpt_ranges|checkpoint,pg"
    "ckpt_torch_pg|python|test_torch_ckpt|checkpoint,pg,python"
    "feed_torch_ddp_pg|python|test_torch_ddp|feed,pg,python,torchrun"
    "sampling2_torchrun_pg|python|test_torch_strat|feed,pg,python,torchrun"
    "feed_torch_train_pg|python|test_torch_train.RankKillTest.test_killed_after_step_two_workers+test_torch_train.DaemonRestartTest.test_daemon_restart_and_rank_kill+test_torch_train.BatchJobTest|feed,pg,python,torchrun,no_asan"
    "ckpt_torch_train_pg|python|test_torch_ckpt_train.ExactTest.test_rank_killed_index_job+test_torch_ckpt_train.ExactTest.test_daemon_killed_during_upload+test_torch_ckpt_train.ResizeTest.test_restart_into_another_world|checkpoint,pg,python,torchrun,no_asan")
foreach (spec ${SL_PG_TESTS})
  string(REPLACE "|" ";" parts "${spec}")
  list(GET parts 0 name)
  list(GET parts 1 dir)
  list(GET parts 2 module)
  list(GET parts 3 labels)
  string(REPLACE "+" ";" module "${module}")
  string(REPLACE "," ";" labels "${labels}")
  add_test(NAME ${name} COMMAND ${SL_PYTHON} -m unittest -v ${module}
           WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/${dir}")
  set_tests_properties(${name} PROPERTIES
                       ENVIRONMENT "${SL_TEST_ENV};SL_TEST_CATALOG=postgresql;SL_TEST_REPLICAS=3"
                       TIMEOUT 600 LABELS "${labels}")
  if ("torchrun" IN_LIST labels)
    set_tests_properties(${name} PROPERTIES RESOURCE_LOCK torchrun_rendezvous_29400 RUN_SERIAL ON)
  endif ()
endforeach ()

# The checkpoint suite once more over three replicas that share one bucket and prefix instead of
# one directory (SL_TEST_STORE=s3: the test process's s3rver, sltest.shared_s3); ~30 s.
add_test(NAME checkpoint_integration_pg_s3 COMMAND ${SL_PYTHON} -m unittest -v test_checkpoints
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(checkpoint_integration_pg_s3 PROPERTIES
                     ENVIRONMENT
                     "${SL_TEST_ENV};SL_TEST_CATALOG=postgresql;SL_TEST_REPLICAS=3;SL_TEST_STORE=s3"
                     TIMEOUT 600 LABELS "checkpoint;pg;s3")

# Three replicas on one PostgreSQL catalog and one data dir (tests/integration/test_replicas.py):
# jobs, epochs and progress made through one reach the others; racing advances; identity; a
# multipart upload to a shared bucket taken over after its replica died; ~20 s.
add_test(NAME replicas_integration COMMAND ${SL_PYTHON} -m unittest -v test_replicas
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(replicas_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 300
                     LABELS "feed;checkpoint;pg;s3")

# Replicas never lose or damage an acknowledged checkpoint (issue 25, tests/integration/
# test_fencing.py): each race held at its exact point (SIGSTOP, a held upload, a claim row, a clock
# 45 s ahead through libfaketime) and a randomized race over 200 rounds; ~2-3 min.
add_test(NAME fencing_integration COMMAND ${SL_PYTHON} -m unittest -v test_fencing
         WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/integration")
set_tests_properties(fencing_integration PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 900
                     LABELS "checkpoint;pg")

# Replicas on PostgreSQL against the SQLite single node (tests/bench/replica_bench.py): reports/s,
# unary calls/s, streams, latency and CPU per unit of work; ctest runs a small smoke round only.
add_test(NAME replica_bench_smoke
         COMMAND ${SL_PYTHON} "${CMAKE_CURRENT_SOURCE_DIR}/bench/replica_bench.py" --smoke)
set_tests_properties(replica_bench_smoke PROPERTIES ENVIRONMENT "${SL_TEST_ENV}" TIMEOUT 120
                     LABELS "bench;pg")
