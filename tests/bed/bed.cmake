# Faults that close no connection, on the cluster bed (tools/cluster_bed.sh: hosts as network and
# IPC namespaces on a bridge; root only, skipped elsewhere with the reason). Each test runs a job,
# injects one fault and checks that every survivor ends within the peer timeout + 2 s with an
# UnavailableError naming the lost worker (or the pair that cannot reach each other), the same
# cause everywhere (tests/bed/bed_fault.sh). MIRRORED_PEER_TIMEOUT_S is 3 s here, except in the
# test of the default (10 s). Label `bed`: `make bed` (CI's stage of that name) runs them, six at
# a time (they mostly wait for heartbeats to stop); the other test presets leave them out (the
# same code runs in the cluster tests there, under the sanitizers too).
set(_bed "${CMAKE_CURRENT_SOURCE_DIR}/bed/bed_fault.sh")
# The job of bed_elastic.sh: records every example id each replica consumes (tests/bed/elastic_ids.cpp).
add_executable(mirrored_bed_elastic_ids bed/elastic_ids.cpp)
target_link_libraries(mirrored_bed_elastic_ids PRIVATE mirrored::mirrored)
mirrored_set_warnings(mirrored_bed_elastic_ids)
function(mirrored_bed_test name)
  add_test(NAME bed.${name} COMMAND bash "${_bed}" "${PROJECT_BINARY_DIR}" ${ARGN})
  set_tests_properties(bed.${name} PROPERTIES LABELS "bed;cluster" SKIP_RETURN_CODE 77 TIMEOUT 120)
endfunction()

# Three hosts, one replica each: every fault, of a worker and of the chief.
foreach(_fault partition-both partition-in partition-out link-down stop kill)
  string(REPLACE "-" "_" _name "${_fault}")
  mirrored_bed_test(a_worker_${_name}_is_named_by_every_survivor ${_fault} 2)
  mirrored_bed_test(the_chief_${_name}_is_named_by_every_worker ${_fault} 0)
endforeach()
# Two hosts with two replicas each: the same faults.
foreach(_fault partition-both partition-in partition-out link-down stop kill)
  string(REPLACE "-" "_" _name "${_fault}")
  mirrored_bed_test(two_replica_hosts_a_worker_${_name} ${_fault} 1 --hosts 2 --replicas 2)
  mirrored_bed_test(two_replica_hosts_the_chief_${_name} ${_fault} 0 --hosts 2 --replicas 2)
endforeach()
# Inside the uneven-input agreement: workers that only step a distributed dataset (each step is the
# agreement on whether anyone still has input) lose a host; the error names get_next.
mirrored_bed_test(a_host_lost_inside_the_uneven_input_agreement_is_named partition-both 2 --program agreement
  --expect-log "DistributedIterator get_next: worker 2 \\(")
# Two hosts with two workers each: shared memory within a host, TCP between them, every
# collective's values exact (integer-valued data: the same sums as the TCP path).
mirrored_bed_test(two_worker_hosts_share_memory_within_a_host_and_tcp_between_them none 0 --hosts 2
  --workers-per-host 2 --expect none --program collectives --settle 0
  --expect-log "cross-worker transport: shared memory within hosts, Gloo over TCP between 2 hosts")
mirrored_bed_test(two_replica_workers_on_two_worker_hosts_sum_exactly none 0 --hosts 2 --workers-per-host 2
  --replicas 2 --expect none --program collectives --settle 0)
mirrored_bed_test(two_worker_hosts_a_worker_partitioned partition-both 3 --hosts 2 --workers-per-host 2)
mirrored_bed_test(two_worker_hosts_a_worker_stopped stop 2 --hosts 2 --workers-per-host 2)
# Two workers that lose each other while both reach the chief: the pair is named.
mirrored_bed_test(two_workers_that_cannot_reach_each_other_are_named_as_a_pair cut 1 --cut-peer 2 --expect pair)
# A partition healed after detection never lets the halves go on: both sides fail.
mirrored_bed_test(a_healed_partition_of_a_worker_fails_both_sides partition-both 2 --heal-after 5)
mirrored_bed_test(a_healed_partition_of_the_chief_fails_both_sides partition-both 0 --heal-after 5)
# With the default peer timeout (10 s), nothing hangs.
mirrored_bed_test(a_partitioned_worker_is_found_within_the_default_peer_timeout partition-both 1 --peer-timeout 10)
# No false alarm: all-reduces slower than the peer timeout on a link capped at 2 Mbit/s complete.
mirrored_bed_test(all_reduces_slower_than_the_peer_timeout_on_a_capped_link_complete cap 0 --cap 2mbit --expect none
  --program big --settle 2)
# A host that never answers at start-up: the others warn while they wait (MIRRORED_STALL_WARN_S)
# and fail at the start-up timeout naming it (a late start looks the same until then).
mirrored_bed_test(a_host_that_never_answers_at_start_up_is_named_after_warnings partition-both 2 --at-start 1
  --collective-timeout 6 --expect never-joined --settle 0 --expect-log "has waited 2 s at start-up for worker 2")
set_tests_properties(bed.a_host_that_never_answers_at_start_up_is_named_after_warnings PROPERTIES
  ENVIRONMENT "MIRRORED_STALL_WARN_S=2")
# A host lost while every step saves a checkpoint: the restarted job resumes from the newest
# complete one and ends bitwise equal to an uninterrupted run (tests/bed/bed_resume.sh).
add_test(NAME bed.a_job_that_lost_a_host_mid_save_resumes_bitwise_equal
  COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/bed/bed_resume.sh" "${PROJECT_BINARY_DIR}")
set_tests_properties(bed.a_job_that_lost_a_host_mid_save_resumes_bitwise_equal PROPERTIES LABELS "bed;cluster"
  SKIP_RETURN_CODE 77 TIMEOUT 180)
# torchrun across the bed's hosts (one agent per host, c10d rendezvous): the weights of
# tools/launch.sh, and after a worker is killed the agents restart the group, which resumes to the
# same weights (tests/bed/bed_torchrun.sh; skipped without torchrun).
add_test(NAME bed.torchrun_across_two_hosts_trains_and_restarts_to_the_weights_of_launch_sh
  COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/bed/bed_torchrun.sh" "${PROJECT_BINARY_DIR}")
set_tests_properties(bed.torchrun_across_two_hosts_trains_and_restarts_to_the_weights_of_launch_sh PROPERTIES
  LABELS "bed;cluster;launcher" SKIP_RETURN_CODE 77 TIMEOUT 240)
# An elastic job under torchrun (--nnodes 2:3) on three hosts loses one mid-epoch: the survivors
# fail fast, the agents re-form with 2 and the job resumes from its checkpoint and finishes, every
# example id of every epoch consumed once, the global batch kept, the final loss within the noise
# of uninterrupted runs (tests/bed/bed_elastic.sh; skipped without torchrun).
add_test(NAME bed.an_elastic_torchrun_job_that_lost_a_host_reforms_and_consumes_every_example_once
  COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/bed/bed_elastic.sh" "${PROJECT_BINARY_DIR}")
# Alone: its three Python agents start at once, a load that would stretch the fault tests' bounds.
set_tests_properties(bed.an_elastic_torchrun_job_that_lost_a_host_reforms_and_consumes_every_example_once PROPERTIES
  LABELS "bed;cluster;launcher" SKIP_RETURN_CODE 77 TIMEOUT 240 RUN_SERIAL TRUE)
