#pragma once
// Private: the name a library thread shows in `top -H`, `ps -L`, gdb and perf.

#include <string>
#include <thread>

namespace mirrored::detail {

/// Names `thread` for the operating system ("mirrored/r0", "mirrored/c1"), cut to the 15
/// characters Linux keeps. Best effort: a name that cannot be set is left as it was.
void set_os_thread_name(std::thread& thread, const std::string& name) noexcept;

}  // namespace mirrored::detail
