#pragma once
/// \file
/// The flight recorder (docs/api.md §15): every replica keeps a ring of its last
/// `MIRRORED_FLIGHT_RECORDER_ENTRIES` (default 256) collectives and merge_calls -- sequence number,
/// kind, op, dtype, shape, bytes, asynchronous or not, issue/start/end times and state (issued,
/// waiting, done, failed). It is always on; deadline, stall, abort and peer-loss messages name, for
/// each replica of each worker, the last collective it completed and the one it waits in. With
/// `MIRRORED_FLIGHT_RECORDER_DIR=dir` every such event also writes this worker's rings to
/// `dir/flight_recorder.worker<W>.json`; `tools/flight_report.py` merges the files of every
/// worker and prints the first divergence.

#include <string>

namespace mirrored::flight_recorder {

/// Writes the rings of every live strategy of this process to `path` as JSON (replaced
/// atomically): `{"worker": W, "num_workers": N, "pid": P, "job_id": J, "attempt": A, "strategies":
/// [{"replicas": [{"replica": R,
/// "device": "CPU:0", "entries": [{"seq", "kind", "op", "dtype", "shape", "bytes", "async",
/// "state", "issue_s", "start_s", "end_s"}...]}]}]}` (times in seconds of the system clock; issue:
/// when the call entered the library, start: when it entered the collective, end: when it ended).
/// J is `MIRRORED_JOB_ID` and A is `MIRRORED_RESTART_COUNT` (tools/launch.sh sets both; null when
/// unset), so that `tools/flight_report.py` merges only the dumps of one attempt of one job.
/// Safe while collectives run: rings are copied without stopping their replicas.
/// \throws the file errors of `mirrored/errors.hpp` (NotFoundError, PermissionDeniedError, ...)
/// when `path` cannot be written.
void dump(const std::string& path);

}  // namespace mirrored::flight_recorder
