#pragma once
/// \file
/// The timeline: a Chrome-trace / Perfetto JSON file of what every thread of the library did — each
/// replica's `run`, every collective (its rendezvous and its bytes), `reduce`, `gather`,
/// `merge_call`, the input pipeline's prefetching and checkpoint saves and loads — like Horovod's
/// timeline. Open the file in https://ui.perfetto.dev or chrome://tracing. docs/timeline.md describes
/// the events.
///
/// Two ways to record one:
/// - set `MIRRORED_TIMELINE=path.json` in the environment. It is read once per process, when the
///   first strategy is created (or the first traced operation runs, if earlier); the timeline is
///   written until the process exits or `stop()` is called. A path that cannot be written is
///   warned about once, through the log, and the program runs on without a timeline: a trace never
///   stops a training job.
/// - call `start(path)` and `stop()` around the part of the program to record.
///
/// In a job of several workers (`MultiWorkerMirroredStrategy`), each worker writes a file of its own,
/// `path` with `.worker<k>` before its extension (`trace.json` → `trace.worker0.json`,
/// `trace.worker1.json`, …), and the worker's task index is the process id in the trace, so the
/// files can be opened together. That applies to timelines started after the strategy was created.
///
/// While no timeline is recorded the library pays one relaxed atomic load per traced operation;
/// while one is, each event costs two clock reads and a record appended to its thread's buffer
/// (docs/timeline.md gives the measured overhead).

#include <string>

namespace mirrored::timeline {

/// Starts recording a timeline into `path` (created, or truncated if it is a regular file; never
/// written through a symbolic link). The file is complete, valid JSON once `stop()` returns or the
/// process exits.
/// \throws FailedPreconditionError when a timeline is already being recorded (naming its file);
/// InvalidArgumentError when `path` is empty, a symbolic link, a directory, a FIFO or another file
/// that is not a regular file; NotFoundError when its directory does not exist; PermissionDeniedError
/// when it may not be written; the errno's text and the path are in the message.
void start(const std::string& path);

/// Stops recording: every event that has ended is written, the JSON is closed and the file too.
/// Harmless when no timeline is being recorded. Events still in progress on other threads (a `run`
/// in flight) are left out.
/// \throws UnavailableError (or FailedPreconditionError when the file system is full or read-only)
/// when writing the file failed at any point of the recording, naming the file and the errno's text;
/// the timeline is stopped all the same.
void stop();

/// True while a timeline is being recorded.
bool active() noexcept;

/// The file the current timeline is written to; empty when none is recorded.
std::string path();

}  // namespace mirrored::timeline
